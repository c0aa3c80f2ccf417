"""Reads, redeliveries, prunes and the inbox page's queries, written once for both SQL dialects
(see :mod:`receiver.store.browse` for the pages).

An event page is fixed ``WHERE`` fragments with named parameters (``:state``), joined by
:func:`browse_sql` as the query needs them: no value is ever put into SQL text.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from receiver.store.browse import (
    Cursor,
    DeadGroup,
    DeadGroupList,
    EventList,
    EventQuery,
    InboxOverview,
    delivery_records,
    lane_counts,
)
from receiver.store.records import (
    DELIVERY_COLUMNS,
    EVENT_COLUMNS,
    EVENT_STATES,
    EventRecord,
    PruneStep,
)
from receiver.store.sql.batches import BatchSql, SqlBatches
from receiver.store.sql.conn import Conn
from receiver.store.sql.records import RecordSql, with_deliveries

# -- SQL both dialects run as it is -------------------------------------------------------------

# Events by state and the oldest pending one, for counts().
COUNTS = """
SELECT
    (SELECT count(*) FROM events WHERE state = 'pending'),
    (SELECT count(*) FROM events WHERE state = 'done'),
    (SELECT count(*) FROM events WHERE state = 'dead'),
    (SELECT min(received_at) FROM events WHERE state = 'pending')
"""
BROWSE_SELECT = "SELECT " + EVENT_COLUMNS + " FROM events"
WHERE_STATE = "state = :state"
WHERE_EVENT = "event = :event"
WHERE_SINK = "EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = events.id AND d.sink = :sink)"
WHERE_SINK_STATE = (
    "EXISTS (SELECT 1 FROM deliveries d"
    " WHERE d.event_id = events.id AND d.sink = :sink AND d.state = :state)"
)
# A delivery still pending means its event is pending: the event-state index narrows the scan
# to the pending events, however many finished ones there are.
WHERE_PENDING_EVENT = "state = 'pending'"
# Dead deliveries are few: read them from the deliveries side (the partial index on dead rows,
# by sink) rather than scanning every event for one.
WHERE_SINK_DEAD = "id IN (SELECT event_id FROM deliveries WHERE state = 'dead' AND sink = :sink)"
# Two primary-key / job-id lookups, whatever order the page is in.
WHERE_REF = (
    "id IN (SELECT id FROM events WHERE id = :ref"
    " UNION ALL SELECT id FROM events WHERE job_id = :ref)"
)
WHERE_SINCE = "received_at >= :since"
WHERE_UNTIL = "received_at < :until"
# (received_at, id) < cursor, written so that the received_at index bounds the scan.
WHERE_BEFORE = "received_at <= :cursor_at AND (received_at < :cursor_at OR id < :cursor_id)"
WHERE_AFTER = "received_at >= :cursor_at AND (received_at > :cursor_at OR id > :cursor_id)"
ORDER_NEWEST_FIRST = " ORDER BY received_at DESC, id DESC LIMIT :limit"
ORDER_OLDEST_FIRST = " ORDER BY received_at, id LIMIT :limit"


def browse_sql(
    query: EventQuery, *, before: Cursor | None, after: Cursor | None, limit: int
) -> tuple[str, dict[str, Any]]:
    """The statement (fixed fragments joined) and its named parameters for one event page.

    With ``after`` the rows come oldest first (the page just newer than the cursor); the caller
    reverses them.
    """
    clauses: list[str] = []
    if query.sink is not None and query.state == "dead":
        clauses.append(WHERE_SINK_DEAD)
    elif query.sink is not None:
        if query.state == "pending":
            clauses.append(WHERE_PENDING_EVENT)
        clauses.append(WHERE_SINK_STATE if query.state is not None else WHERE_SINK)
    elif query.state is not None:
        clauses.append(WHERE_STATE)
    if query.event is not None:
        clauses.append(WHERE_EVENT)
    if query.ref is not None:
        clauses.append(WHERE_REF)
    if query.since is not None:
        clauses.append(WHERE_SINCE)
    if query.until is not None:
        clauses.append(WHERE_UNTIL)
    cursor = after if after is not None else before
    if cursor is not None:
        clauses.append(WHERE_AFTER if after is not None else WHERE_BEFORE)
    sql = BROWSE_SELECT
    if clauses:
        sql += " WHERE " + " AND ".join(clauses)
    sql += ORDER_OLDEST_FIRST if after is not None else ORDER_NEWEST_FIRST
    params: dict[str, Any] = {
        "state": query.state,
        "event": query.event,
        "sink": query.sink,
        "ref": query.ref,
        "since": query.since,
        "until": query.until,
        "cursor_at": cursor.received_at if cursor else None,
        "cursor_id": cursor.id if cursor else None,
        "limit": max(limit, 0),
    }
    return sql, params


# Served by the partial index deliveries_failing.
LANES_FAILING = """
SELECT sink, count(*) FROM deliveries
WHERE last_error IS NOT NULL AND updated_at >= :since GROUP BY sink
"""

RECENT_ERRORS = (
    "SELECT " + DELIVERY_COLUMNS + " FROM deliveries"
    " WHERE last_error IS NOT NULL ORDER BY updated_at DESC LIMIT :limit"
)

# Served by the partial index deliveries_dead_groups (which holds the event id too).
DEAD_GROUPS = """
SELECT sink, last_error, count(*), min(updated_at), max(updated_at)
FROM deliveries WHERE state = 'dead'
GROUP BY sink, last_error ORDER BY count(*) DESC, sink, last_error LIMIT :limit
"""


class BrowseSql:
    """The statements a dialect runs for reads and redeliveries: a backend's subclass
    (``<backend>/browse.py``) sets those without a value here; those with one are the SQL both
    dialects run as it is. ``:ids`` is a list of event ids."""

    RECORDS: ClassVar[type[RecordSql]]
    #: The dialect's statements for redelivery batches (receiver.store.sql.batches).
    BATCHES: ClassVar[type[BatchSql]]
    #: Events newest first (``:limit``, ``:offset``), all or only those in ``:state``.
    LIST_ALL: ClassVar[str]
    LIST_BY_STATE: ClassVar[str]
    #: Delete up to ``:limit`` done events received before ``:older_than``.
    PRUNE_BATCH: ClassVar[str]
    #: Pending deliveries by sink: backlog, oldest due, due at ``:now``, leased at ``:now``.
    LANES_PENDING: ClassVar[str]
    #: The newest ``:limit`` event ids of a dead group (``:sink``, ``:error``).
    DEAD_SAMPLES: ClassVar[str]
    LANES_FAILING: ClassVar[str] = LANES_FAILING
    RECENT_ERRORS: ClassVar[str] = RECENT_ERRORS
    DEAD_GROUPS: ClassVar[str] = DEAD_GROUPS
    COUNTS: ClassVar[str] = COUNTS


class SqlBrowse(SqlBatches):
    """Reads, redelivery batches, prunes and the inbox page of the SQL stores."""

    _browse_sql: type[BrowseSql]

    async def get(self, event_id: str) -> EventRecord | None:
        sql = self._browse_sql.RECORDS

        async def run(c: Conn) -> EventRecord | None:
            rows = await c.rows(sql.SELECT_EVENT, {"event_id": event_id})
            if not rows:
                return None
            return (await with_deliveries(c, sql, rows))[0]

        return await self._run_read(run, snapshot=True)

    async def list(
        self, *, state: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[EventRecord]:
        sql = self._browse_sql
        params = {"state": state, "limit": max(limit, 0), "offset": max(offset, 0)}

        async def run(c: Conn) -> list[EventRecord]:
            rows = await c.rows(sql.LIST_ALL if state is None else sql.LIST_BY_STATE, params)
            return await with_deliveries(c, sql.RECORDS, rows)

        return await self._run_read(run, snapshot=True)

    async def prune(self, *, older_than: float, batch: int = 1000) -> int:
        total = 0
        while True:
            deleted = (await self.prune_step(older_than=older_than, limit=max(batch, 1))).deleted
            total += deleted
            if deleted < max(batch, 1):
                return total

    async def prune_step(self, *, older_than: float, limit: int) -> PruneStep:
        # One short transaction: intake commits between two steps, and row locks (where
        # writers take them) are held for one step only.
        params = {"older_than": older_than, "limit": max(limit, 1)}
        statement = self._browse_sql.PRUNE_BATCH

        async def run(c: Conn) -> PruneStep:
            started = time.perf_counter()
            deleted = await c.run(statement, params)
            return PruneStep(deleted, time.perf_counter() - started)

        return await self._run_write(run, transaction=False, durable=False)

    async def counts(self) -> tuple[dict[str, int], float | None]:
        sql = self._browse_sql

        async def run(c: Conn) -> tuple[dict[str, int], float | None]:
            row = await c.row(sql.COUNTS)
            assert row is not None
            counts: dict[str, int] = {s: int(row[i]) for i, s in enumerate(EVENT_STATES)}
            return counts, row[3]

        return await self._run_read(run)

    # -- reading for people (receiver.store.browse) ---------------------------------------------

    async def browse(
        self,
        query: EventQuery,
        *,
        before: Cursor | None = None,
        after: Cursor | None = None,
        limit: int = 50,
    ) -> EventList:
        sql = self._browse_sql.RECORDS
        statement, params = browse_sql(query, before=before, after=after, limit=limit)

        async def run(c: Conn) -> EventList:
            rows = list(await c.rows(statement, params))
            if after is not None:
                rows.reverse()
            return await with_deliveries(c, sql, rows)

        return await self._run_read(run, snapshot=True)

    async def overview(
        self, *, now: float, failing_since: float, errors: int = 10
    ) -> InboxOverview:
        sql = self._browse_sql

        async def run(c: Conn) -> InboxOverview:
            lanes = lane_counts(
                await c.rows(sql.LANES_PENDING, {"now": now}),
                await c.rows(sql.LANES_FAILING, {"since": failing_since}),
            )
            recent = delivery_records(await c.rows(sql.RECENT_ERRORS, {"limit": errors}))
            return InboxOverview(lanes, recent)

        return await self._run_read(run, snapshot=True)

    async def dead_letters(self, *, groups: int = 100, samples: int = 5) -> DeadGroupList:
        sql = self._browse_sql

        async def run(c: Conn) -> DeadGroupList:
            out = []
            for sink, error, count, first, last in await c.rows(sql.DEAD_GROUPS, {"limit": groups}):
                params = {"sink": sink, "error": error, "limit": samples}
                ids = tuple(row[0] for row in await c.rows(sql.DEAD_SAMPLES, params))
                out.append(DeadGroup(sink, error, count, first, last, ids))
            return out

        return await self._run_read(run, snapshot=True)
