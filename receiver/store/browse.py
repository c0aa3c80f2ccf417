"""Reading the inbox for people: filtered event pages, lane counts and dead letters.

The inbox page (:mod:`receiver.web`) asks the store these questions; every backend answers them
with the records defined here. Event pages are keyset-paginated on ``(received_at, id)``, newest
first: a page is as fast on the millionth event as on the first, and an event received while
someone pages never shifts or repeats a row. The SQL backends' page query is
:func:`receiver.store.sql.browse.browse_sql`; :func:`matches` is the memory store's.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import Any

from receiver.store.records import DeliveryRecord, EventRecord, delivery_record


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
