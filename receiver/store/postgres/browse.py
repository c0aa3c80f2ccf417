"""The Postgres store's reads, redeliveries and prunes, and the inbox page's queries (a mixin)."""

from __future__ import annotations

from typing import Any

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
    numbered,
)
from receiver.store.postgres.mixin import PostgresMixin
from receiver.store.postgres.pull import command_count as _count
from receiver.store.postgres.sql import (
    CHANNEL,
    DEAD_GROUPS,
    DEAD_SAMPLES,
    DELIVERY_STATE,
    LANES_FAILING,
    LANES_PENDING,
    LIST_ALL,
    LIST_BY_STATE,
    LOCK_DEAD_EVENTS,
    LOCK_DEAD_GROUP_EVENTS,
    LOCK_EVENT,
    NOTIFY,
    PRUNE_BATCH,
    RECENT_ERRORS,
    REDELIVER,
    REDELIVER_DEAD,
    REDELIVER_DEAD_GROUP,
    REDELIVER_SINK,
    REENRICH,
    SELECT_EVENT,
    _recompute,
    _with_deliveries,
)
from receiver.store.records import EVENT_STATES, EventRecord


async def _redelivered(conn: Any, event_ids: list[str], now: float, schema: str) -> None:
    """Events with deliveries to send again: their job fetched afresh first (the snapshot may be
    stale by now), their states recomputed, every replica's workers woken on commit."""
    await conn.execute(REENRICH, now, event_ids)
    await _recompute(conn, event_ids)
    await conn.execute(NOTIFY, CHANNEL, schema)


class PostgresBrowse(PostgresMixin):
    """Reads, redeliveries, prunes and the inbox page of the Postgres store."""

    async def get(self, event_id: str) -> EventRecord | None:
        async def run(conn: Any) -> EventRecord | None:
            rows = await conn.fetch(SELECT_EVENT, event_id)
            if not rows:
                return None
            return (await _with_deliveries(conn, rows))[0]

        return await self._run(run, snapshot=True)

    async def list(
        self, *, state: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[EventRecord]:
        limit, offset = max(limit, 0), max(offset, 0)

        async def run(conn: Any) -> list[EventRecord]:
            if state is None:
                rows = await conn.fetch(LIST_ALL, limit, offset)
            else:
                rows = await conn.fetch(LIST_BY_STATE, state, limit, offset)
            return await _with_deliveries(conn, rows)

        return await self._run(run, snapshot=True)

    async def redeliver(self, event_id: str, *, now: float) -> int:
        async def run(conn: Any) -> int:
            if await conn.fetchval(LOCK_EVENT, event_id) is None:
                raise UnknownEvent(f"no event {event_id!r} in the inbox")
            count = _count(await conn.execute(REDELIVER, now, event_id))
            if count:
                await _redelivered(conn, [event_id], now, self._schema)
            return count

        return await self._run(run, transaction=True)

    async def redeliver_dead(self, *, now: float) -> int:
        async def run(conn: Any) -> int:
            ids = [row["id"] for row in await conn.fetch(LOCK_DEAD_EVENTS)]
            if not ids:
                return 0
            count = _count(await conn.execute(REDELIVER_DEAD, now, ids))
            await _redelivered(conn, ids, now, self._schema)
            return count

        return await self._run(run, transaction=True)

    async def prune(self, *, older_than: float, batch: int = 1000) -> int:
        batch = max(batch, 1)

        async def run(conn: Any) -> int:
            return _count(await conn.execute(PRUNE_BATCH, older_than, batch))

        total = 0
        # One short transaction per batch: row locks are held for one batch only, and rows
        # another replica is pruning or redelivering are skipped, never waited for.
        while True:
            deleted = await self._run(run)
            total += deleted
            if deleted < batch:
                return total

    async def counts(self) -> tuple[dict[str, int], float | None]:
        async def run(conn: Any) -> tuple[dict[str, int], float | None]:
            row = await conn.fetchrow(COUNTS)
            counts: dict[str, int] = {s: int(row[i]) for i, s in enumerate(EVENT_STATES)}
            return counts, row[3]

        return await self._run(run)

    # -- reading for people (receiver.store.browse) ---------------------------------------------

    async def browse(
        self,
        query: EventQuery,
        *,
        before: Cursor | None = None,
        after: Cursor | None = None,
        limit: int = 50,
    ) -> EventList:
        sql, args = numbered(*browse_sql(query, before=before, after=after, limit=limit))

        async def run(conn: Any) -> EventList:
            rows = await conn.fetch(sql, *args)
            if after is not None:
                rows.reverse()
            return await _with_deliveries(conn, rows)

        return await self._run(run, snapshot=True)

    async def overview(
        self, *, now: float, failing_since: float, errors: int = 10
    ) -> InboxOverview:
        async def run(conn: Any) -> InboxOverview:
            lanes = lane_counts(
                await conn.fetch(LANES_PENDING, now),
                await conn.fetch(LANES_FAILING, failing_since),
            )
            recent = delivery_records(await conn.fetch(RECENT_ERRORS, errors))
            return InboxOverview(lanes, recent)

        return await self._run(run, snapshot=True)

    async def dead_letters(self, *, groups: int = 100, samples: int = 5) -> DeadGroupList:
        async def run(conn: Any) -> DeadGroupList:
            out = []
            for sink, error, count, first, last in await conn.fetch(DEAD_GROUPS, groups):
                rows = await conn.fetch(DEAD_SAMPLES, sink, error, samples)
                out.append(DeadGroup(sink, error, count, first, last, tuple(r[0] for r in rows)))
            return out

        return await self._run(run, snapshot=True)

    async def redeliver_sink(self, event_id: str, sink: str, *, now: float) -> int:
        async def run(conn: Any) -> int:
            await conn.fetchval(LOCK_EVENT, event_id)
            if await conn.fetchval(DELIVERY_STATE, event_id, sink) is None:
                raise UnknownEvent(f"no delivery {sink!r} for event {event_id!r}")
            count = _count(await conn.execute(REDELIVER_SINK, now, event_id, sink))
            if count:
                await _redelivered(conn, [event_id], now, self._schema)
            return count

        return await self._run(run, transaction=True)

    async def redeliver_dead_group(self, sink: str, error: str | None, *, now: float) -> int:
        async def run(conn: Any) -> int:
            ids = [row["id"] for row in await conn.fetch(LOCK_DEAD_GROUP_EVENTS, sink, error)]
            if not ids:
                return 0
            count = _count(await conn.execute(REDELIVER_DEAD_GROUP, now, ids, sink, error))
            await _redelivered(conn, ids, now, self._schema)
            return count

        return await self._run(run, transaction=True)
