"""The SQLite store's reads, redeliveries and prunes, and the inbox page's queries (a mixin)."""

from __future__ import annotations

import json

import aiosqlite

from receiver.errors import UnknownEvent
from receiver.store.browse import (
    COUNTS,
    Cursor,
    DeadGroup,
    DeadGroupList,
    EventList,
    EventQuery,
    InboxOverview,
    browse_sql,
    delivery_records,
    lane_counts,
)
from receiver.store.records import EVENT_STATES, EventRecord
from receiver.store.sqlite.mixin import SqliteMixin
from receiver.store.sqlite.sql import (
    DEAD_GROUPS,
    DEAD_SAMPLES,
    DELIVERY_STATE,
    LANES_FAILING,
    LANES_PENDING,
    LIST_ALL,
    LIST_BY_STATE,
    PRUNE_BATCH,
    RECENT_ERRORS,
    REDELIVER,
    REDELIVER_DEAD,
    REDELIVER_DEAD_GROUP,
    REDELIVER_SINK,
    REENRICH,
    SELECT_EVENT,
    _recompute,
    _require_event,
    _with_deliveries,
)


async def _redelivered(conn: aiosqlite.Connection, event_ids: list[str], now: float) -> None:
    """Events with deliveries to send again: their job fetched afresh first (the snapshot may be
    stale by now), their states recomputed."""
    await conn.execute(REENRICH, (now, json.dumps(event_ids)))
    await _recompute(conn, event_ids)


class SqliteBrowse(SqliteMixin):
    """Reads, redeliveries, prunes and the inbox page of the SQLite store."""

    async def get(self, event_id: str) -> EventRecord | None:
        async def run(conn: aiosqlite.Connection) -> EventRecord | None:
            rows = list(await conn.execute_fetchall(SELECT_EVENT, (event_id,)))
            if not rows:
                return None
            return (await _with_deliveries(conn, rows))[0]

        return await self._read_tx(run)

    async def list(
        self, *, state: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[EventRecord]:
        limit, offset = max(limit, 0), max(offset, 0)

        async def run(conn: aiosqlite.Connection) -> list[EventRecord]:
            if state is None:
                rows = await conn.execute_fetchall(LIST_ALL, (limit, offset))
            else:
                rows = await conn.execute_fetchall(LIST_BY_STATE, (state, limit, offset))
            return await _with_deliveries(conn, list(rows))

        return await self._read_tx(run)

    async def redeliver(self, event_id: str, *, now: float) -> int:
        async def run(conn: aiosqlite.Connection) -> int:
            await _require_event(conn, event_id)
            count = int((await conn.execute(REDELIVER, (now, now, event_id))).rowcount)
            if count:
                await _redelivered(conn, [event_id], now)
            return count

        return await self._write_tx(run)

    async def redeliver_dead(self, *, now: float) -> int:
        async def run(conn: aiosqlite.Connection) -> int:
            rows = list(await conn.execute_fetchall(REDELIVER_DEAD, (now, now)))
            if rows:
                await _redelivered(conn, list({row[0] for row in rows}), now)
            return len(rows)

        return await self._write_tx(run)

    async def prune(self, *, older_than: float, batch: int = 1000) -> int:
        batch = max(batch, 1)

        async def run(conn: aiosqlite.Connection) -> int:
            return int((await conn.execute(PRUNE_BATCH, (older_than, batch))).rowcount)

        total = 0
        # One short transaction per batch, so intake keeps committing in between.
        while True:
            deleted = await self._write_tx(run)
            total += deleted
            if deleted < batch:
                return total

    async def counts(self) -> tuple[dict[str, int], float | None]:
        async def run(conn: aiosqlite.Connection) -> tuple[dict[str, int], float | None]:
            (row,) = await conn.execute_fetchall(COUNTS)
            counts: dict[str, int] = {state: int(row[i]) for i, state in enumerate(EVENT_STATES)}
            return counts, row[3]

        return await self._read_tx(run)

    # -- reading for people (receiver.store.browse) ---------------------------------------------

    async def browse(
        self,
        query: EventQuery,
        *,
        before: Cursor | None = None,
        after: Cursor | None = None,
        limit: int = 50,
    ) -> EventList:
        sql, params = browse_sql(query, before=before, after=after, limit=limit)

        async def run(conn: aiosqlite.Connection) -> EventList:
            rows = list(await conn.execute_fetchall(sql, params))
            if after is not None:
                rows.reverse()
            return await _with_deliveries(conn, rows)

        return await self._read_tx(run)

    async def overview(
        self, *, now: float, failing_since: float, errors: int = 10
    ) -> InboxOverview:
        async def run(conn: aiosqlite.Connection) -> InboxOverview:
            lanes = lane_counts(
                await conn.execute_fetchall(LANES_PENDING, (now, now)),
                await conn.execute_fetchall(LANES_FAILING, (failing_since,)),
            )
            recent = delivery_records(await conn.execute_fetchall(RECENT_ERRORS, (errors,)))
            return InboxOverview(lanes, recent)

        return await self._read_tx(run)

    async def dead_letters(self, *, groups: int = 100, samples: int = 5) -> DeadGroupList:
        async def run(conn: aiosqlite.Connection) -> DeadGroupList:
            out = []
            for sink, error, count, first, last in await conn.execute_fetchall(
                DEAD_GROUPS, (groups,)
            ):
                rows = await conn.execute_fetchall(DEAD_SAMPLES, (sink, error, samples))
                out.append(DeadGroup(sink, error, count, first, last, tuple(r[0] for r in rows)))
            return out

        return await self._read_tx(run)

    async def redeliver_sink(self, event_id: str, sink: str, *, now: float) -> int:
        async def run(conn: aiosqlite.Connection) -> int:
            if not await conn.execute_fetchall(DELIVERY_STATE, (event_id, sink)):
                raise UnknownEvent(f"no delivery {sink!r} for event {event_id!r}")
            count = int((await conn.execute(REDELIVER_SINK, (now, now, event_id, sink))).rowcount)
            if count:
                await _redelivered(conn, [event_id], now)
            return count

        return await self._write_tx(run)

    async def redeliver_dead_group(self, sink: str, error: str | None, *, now: float) -> int:
        async def run(conn: aiosqlite.Connection) -> int:
            rows = list(await conn.execute_fetchall(REDELIVER_DEAD_GROUP, (now, now, sink, error)))
            if rows:
                await _redelivered(conn, list({row[0] for row in rows}), now)
            return len(rows)

        return await self._write_tx(run)
