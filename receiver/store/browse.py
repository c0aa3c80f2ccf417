"""Reading the inbox for people: filtered event pages, lane counts and dead letters.

The inbox page (:mod:`receiver.web`) asks the store these questions; every backend answers them
with the records defined here. Event pages are keyset-paginated on ``(received_at, id)``, newest
first: a page is as fast on the millionth event as on the first, and an event received while
someone pages never shifts or repeats a row.

The SQL backends share the ``WHERE`` fragments below: each is a fixed string with named
parameters (``:state``); :func:`browse_sql` joins the fragments a query needs, and
:func:`numbered` turns the names into ``$n`` for asyncpg. No value is ever put into SQL text.
"""

from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from receiver.store.records import EVENT_COLUMNS, DeliveryRecord, EventRecord, delivery_record


@dataclass(frozen=True)
class EventQuery:
    """Which events a page shows; every field is optional and they combine with AND.

    ``state`` is the event's state, or, with ``sink``, the state of that sink's delivery (so
    ``sink="slack", state="dead"`` finds the events whose Slack delivery is dead). ``ref`` is an
    event id or a job id. ``since`` <= received_at < ``until``.
    """

    state: str | None = None
    event: str | None = None
    sink: str | None = None
    ref: str | None = None
    since: float | None = None
    until: float | None = None


@dataclass(frozen=True)
class Cursor:
    """A position in the newest-first order: the ``(received_at, id)`` of an event."""

    received_at: float
    id: str

    def encode(self) -> str:
        """An opaque, URL-safe form of the cursor."""
        raw = json.dumps([self.received_at, self.id], separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """The cursor :meth:`encode` made; ValueError for anything else."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            at, event_id = json.loads(raw)
        except (ValueError, TypeError) as exc:
            raise ValueError("not a page cursor") from exc
        if (
            not isinstance(at, int | float)
            or isinstance(at, bool)
            or not math.isfinite(at)
            or not isinstance(event_id, str)
        ):
            raise ValueError("not a page cursor")
        return cls(float(at), event_id)


@dataclass(frozen=True)
class LaneCounts:
    """One sink's deliveries as the store sees them.

    ``backlog`` pending deliveries, ``due`` of them due now, ``oldest_due_at`` the earliest
    ``next_attempt_at`` among them; ``in_flight`` pending deliveries leased to a worker now;
    ``failing`` deliveries whose last attempt failed since the ``failing_since`` asked for.
    """

    sink: str
    backlog: int = 0
    due: int = 0
    oldest_due_at: float | None = None
    in_flight: int = 0
    failing: int = 0


@dataclass(frozen=True)
class InboxOverview:
    """Per-sink counts, and the deliveries that failed most recently (newest first)."""

    lanes: tuple[LaneCounts, ...]
    recent_errors: tuple[DeliveryRecord, ...]


@dataclass(frozen=True)
class DeadGroup:
    """Dead deliveries with the same sink and last error; ``event_ids`` are the newest few."""

    sink: str
    error: str | None
    count: int
    first_at: float
    last_at: float
    event_ids: tuple[str, ...]


# Return types for the stores, whose ``list`` method hides the builtin inside their class.
EventList = list[EventRecord]
DeadGroupList = list[DeadGroup]


def delivery_records(rows: Any) -> tuple[DeliveryRecord, ...]:
    """Records from rows in ``DELIVERY_COLUMNS`` order."""
    return tuple(delivery_record(row) for row in rows)


def lane_counts(pending: Any, failing: Any) -> tuple[LaneCounts, ...]:
    """One record a sink from the overview's two row sets: pending deliveries by sink (sink,
    backlog, oldest due, due now, leased now) and failing ones (sink, count)."""
    lanes: dict[str, dict[str, Any]] = {}
    for sink, backlog, oldest, due, leased in pending:
        lanes.setdefault(sink, {}).update(
            backlog=int(backlog),
            oldest_due_at=oldest,
            due=int(due or 0),
            in_flight=int(leased or 0),
        )
    for sink, count in failing:
        lanes.setdefault(sink, {})["failing"] = int(count)
    return tuple(LaneCounts(sink=sink, **lanes[sink]) for sink in sorted(lanes))


# -- shared SQL ---------------------------------------------------------------------------------

# Events by state and the oldest pending one, for counts(): the same SQL in both dialects.
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


_NAMED = re.compile(r"(?<!:):([a-z_]+)")


def numbered(sql: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
    """``:name`` parameters as ``$1, $2, ...`` (asyncpg), with the arguments in that order."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in order:
            order.append(name)
        return f"${order.index(name) + 1}"

    return _NAMED.sub(number, sql), [params[name] for name in order]


def matches(
    query: EventQuery,
    *,
    event_id: str,
    event: str,
    job_id: str,
    state: str,
    received_at: float,
    deliveries: dict[str, str],
) -> bool:
    """Whether one event passes ``query`` (the in-memory store's version of the SQL)."""
    if query.sink is not None:
        delivery = deliveries.get(query.sink)
        if delivery is None or (query.state is not None and delivery != query.state):
            return False
    elif query.state is not None and state != query.state:
        return False
    return (
        (query.event is None or event == query.event)
        and (query.ref is None or query.ref in (event_id, job_id))
        and (query.since is None or received_at >= query.since)
        and (query.until is None or received_at < query.until)
    )
