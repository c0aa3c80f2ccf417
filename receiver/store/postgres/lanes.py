"""The Postgres store's lanes: enrichment, delivery claims, leases and settling (a mixin)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from receiver.errors import UnknownEvent
from receiver.store import rules
from receiver.store.asset_ledger import LedgerEntry
from receiver.store.lanes_model import (
    LaneClaim,
    LanePolicy,
    LaneResult,
    LaneStats,
    Leases,
    lane_row,
    leased,
)
from receiver.store.postgres.mixin import PostgresMixin
from receiver.store.postgres.pull import RECORD_ASSETS
from receiver.store.postgres.pull import command_count as _count
from receiver.store.postgres.sql import (
    CHANNEL,
    CLAIM_DELIVERIES,
    CLAIM_ENRICHMENT,
    EXTEND_DELIVERY_LEASES,
    EXTEND_EVENT_LEASES,
    FAIL_ENRICHMENT,
    LANE_STATS,
    LOCK_EVENT,
    NEXT_DUE,
    NOTIFY,
    RELEASE_DELIVERIES,
    RELEASE_EVENTS,
    SAVE_SNAPSHOT,
    SELECT_PENDING_SINKS,
    SETTLE,
    SETTLE_PENDING,
    UPDATE_LANE,
    _keys,
    _lane,
    _lane_result,
    _lock_event,
    _recompute,
    _records,
)
from receiver.store.records import EventRecord, EventState, Outcome, Snapshot


class PostgresLanes(PostgresMixin):
    """Enrichment, lane claims, leases and settling of the Postgres store."""

    # -- enrichment -----------------------------------------------------------------------------

    async def claim_enrichment(
        self, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> list[EventRecord]:
        if limit <= 0:
            return []

        async def run(conn: Any) -> list[EventRecord]:
            rows = await conn.fetch(CLAIM_ENRICHMENT, now, limit, owner, now + lease_seconds)
            if not rows:
                return []
            order = {r["id"]: (r["enrich_at"], r["seq"]) for r in rows}
            records = await _records(conn, list(order))
            return sorted(records, key=lambda record: order[record.id])

        return await self._run(run, transaction=True)

    async def save_snapshot(
        self,
        event_id: str,
        snapshot: Snapshot,
        *,
        finished: Mapping[str, Outcome] | None = None,
        ledger: Sequence[LedgerEntry] = (),
        now: float,
    ) -> EventState:
        settles = [rules.settle_row(event_id, sink, o, now) for sink, o in (finished or {}).items()]

        async def run(conn: Any) -> EventState:
            await _lock_event(conn, event_id)
            args = (event_id, snapshot.to_json(), snapshot.fetched_at)
            await conn.execute(SAVE_SNAPSHOT, *args)
            if ledger:
                keys, times = [e.key for e in ledger], [e.upstream_time for e in ledger]
                await conn.execute(RECORD_ASSETS, keys, event_id, times, now)
            for settle in settles:
                await conn.execute(SETTLE_PENDING, *settle)
            # Deliveries became claimable: other replicas' lanes may look now.
            await conn.execute(NOTIFY, CHANNEL, self._schema)
            return (await _recompute(conn, [event_id]))[event_id]

        return await self._run(run, transaction=True)

    async def fail_enrichment(
        self, event_id: str, *, error: str, retry_at: float | None, now: float
    ) -> EventState:
        async def run(conn: Any) -> EventState:
            await _lock_event(conn, event_id)
            await conn.execute(FAIL_ENRICHMENT, event_id, error, retry_at)
            outcome = rules.enrichment_failed(error, retry_at)
            for row in await conn.fetch(SELECT_PENDING_SINKS, event_id):
                await conn.execute(SETTLE, *rules.settle_row(event_id, row["sink"], outcome, now))
            return (await _recompute(conn, [event_id]))[event_id]

        return await self._run(run, transaction=True)

    # -- lanes ----------------------------------------------------------------------------------

    async def claim_deliveries(
        self, policy: LanePolicy, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> LaneClaim:
        async def run(conn: Any) -> LaneClaim:
            # The lane's row lock serialises its claims across replicas: tokens are taken once.
            state = await _lane(conn, policy, now)
            granted = rules.grant(policy, state, now, limit)
            rows = []
            if granted.count > 0:
                rows = await conn.fetch(
                    CLAIM_DELIVERIES, policy.sink, now, granted.count, owner, now + lease_seconds
                )
            new_state, held = rules.after_claim(policy, granted, len(rows), now, lease_seconds)
            if new_state != state:
                await conn.execute(UPDATE_LANE, policy.sink, *lane_row(new_state))
            retry_at = held
            if len(rows) < granted.count:
                retry_at = rules.earliest(held, await conn.fetchval(NEXT_DUE, policy.sink, now))
            if not rows:
                return LaneClaim((), retry_at, held)
            order = {r["event_id"]: (r["next_attempt_at"], r["event_id"]) for r in rows}
            records = sorted(await _records(conn, list(order)), key=lambda e: order[e.id])
            return LaneClaim(tuple(leased(e, policy.sink) for e in records), retry_at, held)

        return await self._run(run, transaction=True)

    async def lane_stats(self, *, now: float) -> dict[str, LaneStats]:
        async def run(conn: Any) -> dict[str, LaneStats]:
            return {
                row[0]: LaneStats(backlog=row[1], oldest_due=row[2], in_flight=row[3])
                for row in await conn.fetch(LANE_STATS, now)
            }

        return await self._run(run)

    # -- leases ---------------------------------------------------------------------------------

    async def extend_leases(
        self, leases: Leases, *, owner: str, lease_seconds: float, now: float
    ) -> None:
        if not leases:
            return
        expires = now + lease_seconds
        event_ids, sinks = _keys(leases)

        async def run(conn: Any) -> None:
            if leases.events:
                await conn.execute(EXTEND_EVENT_LEASES, expires, list(leases.events), owner)
            if event_ids:
                await conn.execute(EXTEND_DELIVERY_LEASES, expires, event_ids, sinks, owner)

        await self._run(run)

    async def release(self, leases: Leases, *, owner: str) -> None:
        if not leases:
            return
        event_ids, sinks = _keys(leases)

        async def run(conn: Any) -> None:
            if leases.events:
                await conn.execute(RELEASE_EVENTS, list(leases.events), owner)
            if event_ids:
                await conn.execute(RELEASE_DELIVERIES, event_ids, sinks, owner)

        await self._run(run)

    # -- settling -------------------------------------------------------------------------------

    async def settle(
        self,
        event_id: str,
        sink: str,
        outcome: Outcome,
        *,
        now: float,
        lane: LaneResult | None = None,
    ) -> EventState:
        args = rules.settle_row(event_id, sink, outcome, now)

        async def run(conn: Any) -> EventState:
            unknown = UnknownEvent(f"no delivery {sink!r} for event {event_id!r}")
            if await conn.fetchval(LOCK_EVENT, event_id) is None:
                raise unknown
            if _count(await conn.execute(SETTLE, *args)) == 0:
                raise unknown
            state = (await _recompute(conn, [event_id]))[event_id]
            if lane is not None:
                await _lane_result(conn, sink, lane, now)
            return state

        return await self._run(run, transaction=True)
