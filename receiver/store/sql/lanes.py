"""Enrichment, delivery claims, leases and settling, written once for both SQL dialects.

Each method is the flow; the backend's :class:`LaneSql` holds the queries that differ (claims:
SQLite's one writer against Postgres's ``FOR UPDATE SKIP LOCKED``; lists of ids). A lane's row
is read through ``LOCK_LANE``: locked until the transaction ends where several processes write
(Postgres), a plain read under SQLite's single writer; a lane never seen is inserted full first,
so the row is there to lock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from receiver.errors import UnknownEvent
from receiver.store import rules
from receiver.store.asset_ledger import LedgerEntry
from receiver.store.lanes_model import (
    LaneClaim,
    LanePolicy,
    LaneResult,
    LaneState,
    LaneStats,
    Leases,
    leased,
)
from receiver.store.records import EventRecord, EventState, Outcome, Snapshot
from receiver.store.sql.conn import Conn, SqlMixin
from receiver.store.sql.records import RecordSql, lock_event, recompute, records
from receiver.store.sql.steps import write_steps
from receiver.store.steps import Step

# -- SQL both dialects run as it is -------------------------------------------------------------

# A refetched snapshot never replaces a newer one.
SAVE_SNAPSHOT = """
UPDATE events
SET snapshot = :snapshot, fetched_at = :fetched_at, enrich_at = NULL, enrich_error = NULL,
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = :event_id AND (fetched_at IS NULL OR fetched_at <= :fetched_at)
"""

FAIL_ENRICHMENT = """
UPDATE events
SET enrich_attempts = enrich_attempts + 1, enrich_error = :error, enrich_at = :retry_at,
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = :event_id
"""

SELECT_PENDING_SINKS = """
SELECT sink FROM deliveries WHERE event_id = :event_id AND state = 'pending' ORDER BY sink
"""

# (The operator's pause, hold_*, is read with the rest and written only by pause and resume.)
SELECT_LANE = """
SELECT tokens, refilled_at, paused_until, failures, opened_at, hold_since, hold_until, hold_reason
FROM lanes WHERE sink = :sink
"""

INSERT_LANE = """
INSERT INTO lanes (sink, tokens, refilled_at, paused_until, failures, opened_at)
VALUES (:sink, :tokens, :refilled_at, :paused_until, :failures, :opened_at)
ON CONFLICT (sink) DO NOTHING
"""

UPDATE_LANE = """
UPDATE lanes SET tokens = :tokens, refilled_at = :refilled_at, paused_until = :paused_until,
    failures = :failures, opened_at = :opened_at
WHERE sink = :sink
"""

# The deliveries a lane's claim takes: due, their event enriched, nobody holding them; oldest
# due first (each dialect's CLAIM_DELIVERIES leases these).
DUE_DELIVERIES = """\
    SELECT d.event_id FROM deliveries d JOIN events e ON e.id = d.event_id
    WHERE d.sink = :sink AND d.state = 'pending' AND d.next_attempt_at <= :now
      AND (d.lease_expires_at IS NULL OR d.lease_expires_at < :now)
      AND e.fetched_at IS NOT NULL
    ORDER BY d.next_attempt_at, d.event_id
    LIMIT :limit
"""

NEXT_DUE = """
SELECT min(d.next_attempt_at) FROM deliveries d JOIN events e ON e.id = d.event_id
WHERE d.sink = :sink AND d.state = 'pending' AND d.next_attempt_at > :now
  AND e.fetched_at IS NOT NULL
"""

# The sinks with a pending delivery, one index probe each (the partial index deliveries_due,
# led by the sink): however many deliveries are pending, it never counts them.
PENDING_SINKS = """
WITH RECURSIVE pending (sink) AS (
    SELECT sink FROM (
        SELECT sink FROM deliveries WHERE state = 'pending' ORDER BY sink LIMIT 1
    ) AS first
    UNION ALL
    SELECT (
        SELECT d.sink FROM deliveries d
        WHERE d.state = 'pending' AND d.sink > p.sink ORDER BY d.sink LIMIT 1
    )
    FROM pending p WHERE p.sink IS NOT NULL
)
SELECT sink FROM pending WHERE sink IS NOT NULL
"""

SETTLE = """
UPDATE deliveries
SET state = :state, attempts = attempts + :attempts_add, next_attempt_at = :next_attempt_at,
    last_error = :last_error, updated_at = :now, lease_owner = NULL, lease_expires_at = NULL
WHERE event_id = :event_id AND sink = :sink
"""

SETTLE_PENDING = SETTLE + " AND state = 'pending'"


class LaneSql:
    """The lane statements a dialect runs: a backend's subclass (``<backend>/lanes.py``) sets
    those without a value here; those with one are the SQL both dialects run as it is."""

    RECORDS: ClassVar[type[RecordSql]]
    #: Lease events due for enrichment (``:owner``, ``:expires``, ``:now``, ``:limit``),
    #: returning ``id, enrich_at, <insertion order>``.
    CLAIM_ENRICHMENT: ClassVar[str]
    #: Lease a lane's due deliveries whose event has its snapshot, oldest due first (``:sink``
    #: and the above), returning ``event_id, next_attempt_at``.
    CLAIM_DELIVERIES: ClassVar[str]
    #: Per sink: deliveries waiting and due, the oldest due time, deliveries leased (``:now``).
    LANE_STATS: ClassVar[str]
    #: Push (``:expires``) or drop the leases ``:owner`` holds on events ``:ids``...
    EXTEND_EVENT_LEASES: ClassVar[str]
    RELEASE_EVENTS: ClassVar[str]
    #: ... and on deliveries (``:event_ids`` and ``:sinks``, pairwise).
    EXTEND_DELIVERY_LEASES: ClassVar[str]
    RELEASE_DELIVERIES: ClassVar[str]
    #: Asset-ledger entries (``:keys`` with ``:times``) of ``:event_id`` at ``:now``.
    RECORD_ASSETS: ClassVar[str]
    #: A lane's state (``:sink``), locked until the transaction ends where writers lock rows.
    LOCK_LANE: ClassVar[str] = SELECT_LANE
    SAVE_SNAPSHOT: ClassVar[str] = SAVE_SNAPSHOT
    FAIL_ENRICHMENT: ClassVar[str] = FAIL_ENRICHMENT
    SELECT_PENDING_SINKS: ClassVar[str] = SELECT_PENDING_SINKS
    INSERT_LANE: ClassVar[str] = INSERT_LANE
    UPDATE_LANE: ClassVar[str] = UPDATE_LANE
    NEXT_DUE: ClassVar[str] = NEXT_DUE
    SETTLE: ClassVar[str] = SETTLE
    SETTLE_PENDING: ClassVar[str] = SETTLE_PENDING


def lane_params(sink: str, state: LaneState) -> dict[str, Any]:
    """A lane's row as the parameters of ``INSERT_LANE`` and ``UPDATE_LANE``."""
    return {
        "sink": sink,
        "tokens": state.tokens,
        "refilled_at": state.refilled_at,
        "paused_until": state.paused_until,
        "failures": state.failures,
        "opened_at": state.opened_at,
    }


def settle_params(event_id: str, sink: str, outcome: Outcome, now: float) -> dict[str, Any]:
    """:func:`rules.settle_values` as the parameters of ``SETTLE``."""
    v = rules.settle_values(outcome, now)
    return {
        "state": v.state,
        "attempts_add": v.attempts_add,
        "next_attempt_at": v.next_attempt_at,
        "last_error": v.last_error,
        "now": now,
        "event_id": event_id,
        "sink": sink,
    }


async def lane_state(c: Conn, sql: type[LaneSql], policy: LanePolicy, now: float) -> LaneState:
    """The lane's row (locked where writers lock rows), inserted full when missing."""
    row = await c.row(sql.LOCK_LANE, {"sink": policy.sink})
    if row is None:
        await c.run(sql.INSERT_LANE, lane_params(policy.sink, rules.fresh_lane(policy, now)))
        row = await c.row(sql.LOCK_LANE, {"sink": policy.sink})
        assert row is not None
    return LaneState(*row)


async def lane_result(
    c: Conn, sql: type[LaneSql], sink: str, result: LaneResult, now: float
) -> None:
    """Apply one attempt's result to its lane; the row is locked only when it changes."""
    row = await c.row(SELECT_LANE, {"sink": sink})
    state = LaneState(*row) if row is not None else rules.fresh_lane(result.policy, now)
    if rules.after_result(state, result, now) is None:
        return
    changed = rules.after_result(await lane_state(c, sql, result.policy, now), result, now)
    if changed is not None:
        await c.run(sql.UPDATE_LANE, lane_params(sink, changed))


def _pairs(leases: Leases) -> dict[str, list[str]]:
    return {
        "event_ids": [k.event_id for k in leases.deliveries],
        "sinks": [k.sink for k in leases.deliveries],
    }


class SqlLanes(SqlMixin):
    """Enrichment, lane claims, leases and settling of the SQL stores."""

    _lane_sql: type[LaneSql]

    # -- enrichment -----------------------------------------------------------------------------

    async def claim_enrichment(
        self, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> list[EventRecord]:
        if limit <= 0:
            return []
        sql = self._lane_sql
        params = {"owner": owner, "expires": now + lease_seconds, "now": now, "limit": limit}

        async def run(c: Conn) -> list[EventRecord]:
            rows = await c.rows(sql.CLAIM_ENRICHMENT, params)
            if not rows:
                return []
            order = {row[0]: (row[1], row[2]) for row in rows}
            found = await records(c, sql.RECORDS, list(order))
            return sorted(found, key=lambda record: order[record.id])

        return await self._run_write(run, durable=False)

    async def save_snapshot(
        self,
        event_id: str,
        snapshot: Snapshot,
        *,
        finished: Mapping[str, Outcome] | None = None,
        ledger: Sequence[LedgerEntry] = (),
        now: float,
        steps: Sequence[Step] = (),
    ) -> EventState:
        sql = self._lane_sql
        settles = [settle_params(event_id, sink, o, now) for sink, o in (finished or {}).items()]
        args = {
            "event_id": event_id,
            "snapshot": snapshot.to_json(),
            "fetched_at": snapshot.fetched_at,
        }
        assets = {
            "keys": [e.key for e in ledger],
            "times": [e.upstream_time for e in ledger],
            "event_id": event_id,
            "now": now,
        }

        async def run(c: Conn) -> EventState:
            await lock_event(c, sql.RECORDS, event_id)
            await c.run(sql.SAVE_SNAPSHOT, args)
            if ledger:
                await c.run(sql.RECORD_ASSETS, assets)
            for settle in settles:
                await c.run(sql.SETTLE_PENDING, settle)
            await write_steps(c, event_id, steps)
            await c.notify()  # deliveries became claimable: other processes' lanes may look now
            return (await recompute(c, sql.RECORDS, [event_id]))[event_id]

        return await self._run_write(run, durable=False)

    async def fail_enrichment(
        self,
        event_id: str,
        *,
        error: str,
        retry_at: float | None,
        now: float,
        steps: Sequence[Step] = (),
    ) -> EventState:
        sql = self._lane_sql
        outcome = rules.enrichment_failed(error, retry_at)

        async def run(c: Conn) -> EventState:
            await lock_event(c, sql.RECORDS, event_id)
            params = {"event_id": event_id, "error": error, "retry_at": retry_at}
            await c.run(sql.FAIL_ENRICHMENT, params)
            for (sink,) in await c.rows(sql.SELECT_PENDING_SINKS, {"event_id": event_id}):
                await c.run(sql.SETTLE, settle_params(event_id, sink, outcome, now))
            await write_steps(c, event_id, steps)
            return (await recompute(c, sql.RECORDS, [event_id]))[event_id]

        return await self._run_write(run, durable=False)

    # -- lanes ----------------------------------------------------------------------------------

    async def claim_deliveries(
        self, policy: LanePolicy, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> LaneClaim:
        sql = self._lane_sql
        params = {"owner": owner, "expires": now + lease_seconds, "sink": policy.sink, "now": now}

        async def run(c: Conn) -> LaneClaim:
            # The lane's state is read and written in this one transaction (its row locked
            # where several processes write): tokens are taken once.
            state = await lane_state(c, sql, policy, now)
            granted = rules.grant(policy, state, now, limit)
            rows: Sequence[Sequence[Any]] = []
            if granted.count > 0:
                rows = await c.rows(sql.CLAIM_DELIVERIES, {**params, "limit": granted.count})
            new_state, held = rules.after_claim(policy, granted, len(rows), now, lease_seconds)
            if new_state != state:
                await c.run(sql.UPDATE_LANE, lane_params(policy.sink, new_state))
            retry_at = held
            if len(rows) < granted.count:
                nxt = await c.value(sql.NEXT_DUE, {"sink": policy.sink, "now": now})
                retry_at = rules.earliest(held, nxt)
            if not rows:
                return LaneClaim((), retry_at, held)
            order = {row[0]: (row[1], row[0]) for row in rows}
            found = sorted(await records(c, sql.RECORDS, list(order)), key=lambda e: order[e.id])
            return LaneClaim(tuple(leased(e, policy.sink) for e in found), retry_at, held)

        return await self._run_write(run, durable=False)

    async def lane_stats(self, *, now: float) -> dict[str, LaneStats]:
        sql = self._lane_sql

        async def run(c: Conn) -> dict[str, LaneStats]:
            return {
                row[0]: LaneStats(backlog=row[1] or 0, oldest_due=row[2], in_flight=row[3] or 0)
                for row in await c.rows(sql.LANE_STATS, {"now": now})
            }

        return await self._run_read(run)

    async def pending_sinks(self) -> set[str]:
        async def run(c: Conn) -> set[str]:
            return {row[0] for row in await c.rows(PENDING_SINKS)}

        return await self._run_read(run)

    # -- leases ---------------------------------------------------------------------------------

    async def extend_leases(
        self, leases: Leases, *, owner: str, lease_seconds: float, now: float
    ) -> None:
        if not leases:
            return
        sql = self._lane_sql
        held = {"expires": now + lease_seconds, "owner": owner}

        async def run(c: Conn) -> None:
            if leases.events:
                await c.run(sql.EXTEND_EVENT_LEASES, {**held, "ids": list(leases.events)})
            if leases.deliveries:
                await c.run(sql.EXTEND_DELIVERY_LEASES, {**held, **_pairs(leases)})

        await self._run_write(run, transaction=False, durable=False)

    async def release(self, leases: Leases, *, owner: str) -> None:
        if not leases:
            return
        sql = self._lane_sql

        async def run(c: Conn) -> None:
            if leases.events:
                await c.run(sql.RELEASE_EVENTS, {"owner": owner, "ids": list(leases.events)})
            if leases.deliveries:
                await c.run(sql.RELEASE_DELIVERIES, {"owner": owner, **_pairs(leases)})

        await self._run_write(run, transaction=False, durable=False)

    # -- settling -------------------------------------------------------------------------------

    async def settle(
        self,
        event_id: str,
        sink: str,
        outcome: Outcome,
        *,
        now: float,
        lane: LaneResult | None = None,
        steps: Sequence[Step] = (),
    ) -> EventState:
        sql = self._lane_sql
        args = settle_params(event_id, sink, outcome, now)

        async def run(c: Conn) -> EventState:
            unknown = UnknownEvent(f"no delivery {sink!r} for event {event_id!r}")
            # Where writers lock rows, the event's row first: two deliveries of one event settled
            # on two connections cannot both miss the other's result.
            if sql.RECORDS.LOCKS_ROWS and await c.value(sql.RECORDS.LOCK_EVENT, args) is None:
                raise unknown
            if await c.run(sql.SETTLE, args) == 0:
                raise unknown
            await write_steps(c, event_id, steps)
            state = (await recompute(c, sql.RECORDS, [event_id]))[event_id]
            if lane is not None:
                await lane_result(c, sql, sink, lane, now)
            return state

        return await self._run_write(run, durable=False)
