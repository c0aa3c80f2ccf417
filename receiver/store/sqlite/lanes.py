"""The SQLite store's work on lanes: enrichment, delivery claims, leases and settling (a mixin)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import aiosqlite

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
from receiver.store.records import EventRecord, EventState, Outcome, Snapshot
from receiver.store.sqlite.mixin import SqliteMixin
from receiver.store.sqlite.pull import RECORD_ASSET
from receiver.store.sqlite.sql import (
    CLAIM_DELIVERIES,
    CLAIM_ENRICHMENT,
    EXTEND_DELIVERY_LEASE,
    EXTEND_EVENT_LEASES,
    FAIL_ENRICHMENT,
    LANE_STATS,
    NEXT_DUE,
    RELEASE_DELIVERY,
    RELEASE_EVENTS,
    SAVE_SNAPSHOT,
    SELECT_PENDING_SINKS,
    SETTLE,
    SETTLE_PENDING,
    UPSERT_LANE,
    _lane,
    _recompute,
    _records,
    _require_event,
)


class SqliteLanes(SqliteMixin):
    """Enrichment, lane claims, leases and settling of the SQLite store."""

    # -- enrichment -----------------------------------------------------------------------------

    async def claim_enrichment(
        self, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> list[EventRecord]:
        if limit <= 0:
            return []
        params = {"owner": owner, "expires": now + lease_seconds, "now": now, "limit": limit}

        async def run(conn: aiosqlite.Connection) -> list[EventRecord]:
            rows = list(await conn.execute_fetchall(CLAIM_ENRICHMENT, params))
            if not rows:
                return []
            order = {row[0]: (row[1], row[2]) for row in rows}
            records = await _records(conn, list(order))
            return sorted(records, key=lambda record: order[record.id])

        return await self._write_tx(run)

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
        args = (snapshot.to_json(), snapshot.fetched_at, event_id, snapshot.fetched_at)

        async def run(conn: aiosqlite.Connection) -> EventState:
            await _require_event(conn, event_id)
            await conn.execute(SAVE_SNAPSHOT, args)
            if ledger:
                await conn.executemany(
                    RECORD_ASSET, [(e.key, event_id, e.upstream_time, now) for e in ledger]
                )
            for settle in settles:
                await conn.execute(SETTLE_PENDING, settle)
            return (await _recompute(conn, [event_id]))[event_id]

        return await self._write_tx(run)

    async def fail_enrichment(
        self, event_id: str, *, error: str, retry_at: float | None, now: float
    ) -> EventState:
        async def run(conn: aiosqlite.Connection) -> EventState:
            await _require_event(conn, event_id)
            await conn.execute(FAIL_ENRICHMENT, (error, retry_at, event_id))
            outcome = rules.enrichment_failed(error, retry_at)
            for (sink,) in await conn.execute_fetchall(SELECT_PENDING_SINKS, (event_id,)):
                await conn.execute(SETTLE, rules.settle_row(event_id, sink, outcome, now))
            return (await _recompute(conn, [event_id]))[event_id]

        return await self._write_tx(run)

    # -- lanes ----------------------------------------------------------------------------------

    async def claim_deliveries(
        self, policy: LanePolicy, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> LaneClaim:
        expires = now + lease_seconds

        async def run(conn: aiosqlite.Connection) -> LaneClaim:
            # One writer: the lane's state is read and written in this one transaction.
            state = await _lane(conn, policy, now)
            granted = rules.grant(policy, state, now, limit)
            rows: list[Any] = []
            if granted.count > 0:
                params = {
                    "owner": owner,
                    "expires": expires,
                    "sink": policy.sink,
                    "now": now,
                    "limit": granted.count,
                }
                rows = list(await conn.execute_fetchall(CLAIM_DELIVERIES, params))
            new_state, held = rules.after_claim(policy, granted, len(rows), now, lease_seconds)
            if new_state != state:
                await conn.execute(UPSERT_LANE, (policy.sink, *lane_row(new_state)))
            retry_at = held
            if len(rows) < granted.count:
                ((nxt,),) = await conn.execute_fetchall(NEXT_DUE, (policy.sink, now))
                retry_at = rules.earliest(held, nxt)
            if not rows:
                return LaneClaim((), retry_at, held)
            order = {row[0]: (row[1], row[0]) for row in rows}
            records = sorted(await _records(conn, list(order)), key=lambda e: order[e.id])
            return LaneClaim(tuple(leased(e, policy.sink) for e in records), retry_at, held)

        return await self._write_tx(run)

    async def lane_stats(self, *, now: float) -> dict[str, LaneStats]:
        async def run(conn: aiosqlite.Connection) -> dict[str, LaneStats]:
            return {
                row[0]: LaneStats(backlog=row[1] or 0, oldest_due=row[2], in_flight=row[3] or 0)
                for row in await conn.execute_fetchall(LANE_STATS, {"now": now})
            }

        return await self._read_tx(run)

    # -- leases ---------------------------------------------------------------------------------

    async def extend_leases(
        self, leases: Leases, *, owner: str, lease_seconds: float, now: float
    ) -> None:
        if not leases:
            return
        expires = now + lease_seconds

        async def run(conn: aiosqlite.Connection) -> None:
            if leases.events:
                await conn.execute(EXTEND_EVENT_LEASES, (expires, json.dumps(leases.events), owner))
            await conn.executemany(
                EXTEND_DELIVERY_LEASE,
                [(expires, k.event_id, k.sink, owner) for k in leases.deliveries],
            )

        await self._write_tx(run)

    async def release(self, leases: Leases, *, owner: str) -> None:
        if not leases:
            return

        async def run(conn: aiosqlite.Connection) -> None:
            if leases.events:
                await conn.execute(RELEASE_EVENTS, (json.dumps(leases.events), owner))
            await conn.executemany(
                RELEASE_DELIVERY, [(k.event_id, k.sink, owner) for k in leases.deliveries]
            )

        await self._write_tx(run)

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

        async def run(conn: aiosqlite.Connection) -> EventState:
            if (await conn.execute(SETTLE, args)).rowcount == 0:
                raise UnknownEvent(f"no delivery {sink!r} for event {event_id!r}")
            state = (await _recompute(conn, [event_id]))[event_id]
            if lane is not None:
                current = await _lane(conn, lane.policy, now)
                changed = rules.after_result(current, lane, now)
                if changed is not None:
                    await conn.execute(UPSERT_LANE, (sink, *lane_row(changed)))
            return state

        return await self._write_tx(run)
