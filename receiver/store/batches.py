"""Redelivery batches: which deliveries a batch selects, its progress, and how it is stepped.

A *batch* is a stored request to send a set of deliveries again: a :class:`RedeliveryFilter`,
who asked and when, and its progress. The running receiver (any replica) carries it out in
*steps*: each step looks at the next :data:`STEP_EVENTS` events at most, in event id order after
the batch's cursor, and makes their matching deliveries pending and due now, marked with the
batch's id, in one short transaction; the lanes then send them at their own pace. Once every
event was looked at, the batch is *queued*; once none of its deliveries is pending any more it is
*done* and its counts are kept with it.

A cancelled batch queues nothing more and *withdraws* what no lane has started to send: each
delivery a step queues keeps what it was before (``before_batch``: its state, attempts, due
time, last error, the batch that had it, and its event's enrichment when the step had the job
fetched again), and the cancel puts every one of its deliveries that is still pending and not
leased back as it was; ``withdrawn`` counts them. The cancel itself and the first
:data:`WITHDRAW_DELIVERIES` deliveries are one transaction (a whole batch of ordinary size);
a larger batch's rest follows in further transactions of that size before the cancel answers,
and no lane claims any of them meanwhile (a claim passes over a cancelled batch's deliveries
that are kept to be put back). Only sends in flight at the cancel may still complete; one that
fails and waits for a retry is withdrawn when its batch is closed.

Progress: ``matched`` (counted when the batch was made; set to ``queued`` once queuing ends),
``queued`` (made pending by the batch), ``withdrawn`` (of those, put back by a cancel: no longer
the batch's), and of the rest, by their state now, ``delivered`` (done), ``failed`` (dead),
``skipped`` (the fresh job showed the sink's filter does not match) and ``pending``. A delivery
another batch takes later counts for that batch.

The SQL backends select with :mod:`receiver.store.sql.batches`; :func:`delivery_matches` and
:func:`event_matches` are the memory store's version of the same rules. This module imports
nothing of the store but its records.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from receiver.store.records import DeliveryRecord

#: What a batch selects by a delivery's state (``failed``: pending, its last attempt failed).
REDELIVERY_STATUSES = ("dead", "failed", "pending", "done", "any")
BatchState = Literal["running", "done", "cancelled"]
BATCH_STATES: tuple[BatchState, ...] = ("running", "done", "cancelled")
#: Events one step looks at, at most: one short transaction, whatever the batch's size.
STEP_EVENTS = 250
#: Deliveries one transaction of a cancel puts back, about (with the rest of their events'):
#: a fraction of a second, even on SQLite, whose writer intake waits for.
WITHDRAW_DELIVERIES = 2000


class UnknownBatch(LookupError):
    """No redelivery batch with that id."""


@dataclass(frozen=True)
class RedeliveryFilter:
    """Which deliveries a batch sends again; every field narrows it (AND).

    ``status`` is the delivery's state (``failed``: pending and its last attempt failed,
    ``any``: every state but skipped); ``sinks`` the sinks (empty: all); ``event``, ``job_id``
    and ``event_id`` the event's name, job and id; ``since`` <= received_at < ``until``;
    ``error`` the delivery's last error, exactly (a dead-letter group). A delivery being sent
    right now (leased) is never selected.
    """

    status: str = "dead"
    sinks: tuple[str, ...] = ()
    event: str | None = None
    job_id: str | None = None
    since: float | None = None
    until: float | None = None
    event_id: str | None = None
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The filter as stored and shown: ``sinks`` a list, every field present."""
        return {
            "status": self.status,
            "sinks": list(self.sinks),
            "event": self.event,
            "job_id": self.job_id,
            "since": self.since,
            "until": self.until,
            "event_id": self.event_id,
            "error": self.error,
        }

    def to_text(self) -> str:
        return json.dumps(self.as_json(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_text(cls, text: str) -> RedeliveryFilter:
        data = json.loads(text)
        return cls(**{**data, "sinks": tuple(data.get("sinks") or ())})


@dataclass(frozen=True)
class MatchedDelivery:
    """One delivery a filter selects, as a preview shows it."""

    delivery: DeliveryRecord
    event: str
    received_at: float

    def as_json(self) -> dict[str, Any]:
        return {
            **self.delivery.as_json(),
            "event_id": self.delivery.event_id,
            "event": self.event,
            "received_at": self.received_at,
        }


@dataclass(frozen=True)
class RedeliveryPreview:
    """What a batch with this filter would select now: how many, and the first few."""

    matched: int
    sample: tuple[MatchedDelivery, ...] = ()


@dataclass(frozen=True)
class Progress:
    """A batch's deliveries by their state now (``pending`` not yet sent or retrying)."""

    delivered: int = 0
    failed: int = 0
    skipped: int = 0
    pending: int = 0


@dataclass(frozen=True)
class RedeliveryBatch:
    """A stored batch and its progress.

    ``cursor`` is the last event id looked at (None before the first step); ``queued_at`` when
    every event was looked at (None while queuing); ``finished_at`` when none of its deliveries
    was pending any more (its counts are then kept as they were).
    """

    id: str
    filter: RedeliveryFilter
    created_by: str
    created_at: float
    state: BatchState
    matched: int
    queued: int = 0
    progress: Progress = field(default_factory=Progress)
    cursor: str | None = None
    queued_at: float | None = None
    finished_at: float | None = None
    cancelled_at: float | None = None
    withdrawn: int = 0

    @property
    def queuing(self) -> bool:
        """Steps remain: still running and not every event was looked at."""
        return self.state == "running" and self.queued_at is None

    def as_json(self) -> dict[str, Any]:
        p = self.progress
        return {
            "id": self.id,
            "state": self.state,
            "filter": self.filter.as_json(),
            "created_by": self.created_by,
            "created_at": self.created_at,
            "matched": self.matched,
            "queued": self.queued,
            "delivered": p.delivered,
            "failed": p.failed,
            "skipped": p.skipped,
            "pending": p.pending,
            "withdrawn": self.withdrawn,
            "queued_at": self.queued_at,
            "finished_at": self.finished_at,
            "cancelled_at": self.cancelled_at,
        }


# Return types for the stores, whose ``list`` method hides the builtin inside their class.
BatchList = list[RedeliveryBatch]
BatchIds = list[str]

# The columns the SQL backends select a batch in, so one function maps rows to batches.
BATCH_COLUMNS = (
    "id, filter, created_by, created_at, state, matched, queued, cursor, queued_at, "
    "finished_at, cancelled_at, delivered, failed, skipped, withdrawn"
)


def batch_record(row: Any, live: Progress | None = None) -> RedeliveryBatch:
    """A batch from a row in ``BATCH_COLUMNS`` order: its kept counts once finished, else
    ``live`` (its deliveries counted now)."""
    kept = Progress(row[11] or 0, row[12] or 0, row[13] or 0) if row[9] is not None else None
    return RedeliveryBatch(
        id=row[0],
        filter=RedeliveryFilter.from_text(row[1]),
        created_by=row[2],
        created_at=row[3],
        state=row[4],
        matched=row[5],
        queued=row[6],
        cursor=row[7],
        queued_at=row[8],
        finished_at=row[9],
        cancelled_at=row[10],
        progress=kept or live or Progress(),
        withdrawn=row[14] or 0,
    )


def progress_of(rows: Iterable[Sequence[Any]]) -> Progress:
    """A batch's progress from ``(delivery state, count)`` rows."""
    counts = {state: int(count) for state, count in rows}
    return Progress(
        delivered=counts.get("done", 0),
        failed=counts.get("dead", 0),
        skipped=counts.get("skipped", 0),
        pending=counts.get("pending", 0),
    )


def step_done(batch: RedeliveryBatch, looked_at: int, limit: int) -> bool:
    """A step that looked at fewer events than it could has reached the end."""
    return looked_at < limit


def after_step(
    batch: RedeliveryBatch, *, cursor: str | None, queued: int, last: bool, now: float
) -> RedeliveryBatch:
    """The batch after a step that queued ``queued`` deliveries and looked up to ``cursor``;
    after the ``last`` step ``matched`` becomes what was queued (deliveries change while a
    batch is queued: what it found is what it matched)."""
    total = batch.queued + queued
    if not last:
        return replace(batch, queued=total, cursor=cursor or batch.cursor)
    return replace(batch, queued=total, cursor=cursor or batch.cursor, matched=total, queued_at=now)


def finished(batch: RedeliveryBatch, progress: Progress, now: float) -> RedeliveryBatch:
    """A batch none of whose deliveries is pending any more: done (a cancelled one stays
    cancelled), its counts kept."""
    state: BatchState = "done" if batch.state == "running" else batch.state
    return replace(batch, state=state, progress=progress, finished_at=now)


# -- matching (the memory store's version of the SQL in receiver.store.sql.batches) -------------


def delivery_matches(
    flt: RedeliveryFilter, *, state: str, sink: str, last_error: str | None, leased: bool
) -> bool:
    """Whether a delivery (of an event that matches) is selected by ``flt``."""
    if state == "skipped" or leased:
        return False
    if flt.sinks and sink not in flt.sinks:
        return False
    if flt.error is not None and last_error != flt.error:
        return False
    if flt.status == "any":
        return True
    if flt.status == "failed":
        return state == "pending" and last_error is not None
    return state == flt.status


def event_matches(
    flt: RedeliveryFilter, *, event_id: str, event: str, job_id: str, received_at: float
) -> bool:
    """Whether an event passes the event half of ``flt``."""
    return (
        (flt.event is None or event == flt.event)
        and (flt.job_id is None or job_id == flt.job_id)
        and (flt.event_id is None or event_id == flt.event_id)
        and (flt.since is None or received_at >= flt.since)
        and (flt.until is None or received_at < flt.until)
    )


# -- reading a filter from people (the admin API, the inbox page, the command line) -----------


class BadFilter(ValueError):
    """A filter field that cannot be used; ``field`` names it."""

    def __init__(self, field_name: str, message: str) -> None:
        self.field = field_name
        self.message = message
        super().__init__(f"{field_name}: {message}")


FILTER_FIELDS = ("status", "sinks", "event", "job_id", "since", "until", "event_id", "error")


def filter_from(data: Mapping[str, Any], *, sinks: Iterable[str], when: Any) -> RedeliveryFilter:
    """A filter from JSON-like ``data`` (the admin API's body, the page's form, the command
    line's options); ``sinks`` are the configured sink names; ``when(field, value)`` turns a
    ``since``/``until`` value into a time (or raises ValueError). Raises :class:`BadFilter`
    naming the first field that is wrong."""
    unknown = sorted(set(data) - set(FILTER_FIELDS))
    if unknown:
        raise BadFilter(unknown[0], f"not a filter field (fields: {', '.join(FILTER_FIELDS)})")
    status = data.get("status")
    if status is None:
        status = "dead"
    if status not in REDELIVERY_STATUSES:
        raise BadFilter("status", f"must be one of {', '.join(REDELIVERY_STATUSES)}")
    known = list(sinks)
    chosen = data.get("sinks") or []
    if isinstance(chosen, str):
        chosen = [chosen]
    if not isinstance(chosen, list | tuple) or not all(isinstance(s, str) for s in chosen):
        raise BadFilter("sinks", "must be a list of sink names")
    for sink in chosen:
        if sink not in known:
            raise BadFilter("sinks", f"no sink named {sink!r} (sinks: {', '.join(known)})")
    text: dict[str, str | None] = {}
    for name in ("event", "job_id", "event_id", "error"):
        value = data.get(name)
        if value is not None and (not isinstance(value, str) or not value):
            raise BadFilter(name, "must be a non-empty string")
        text[name] = value
    times: dict[str, float | None] = {}
    for name in ("since", "until"):
        value = data.get(name)
        if value is None or value == "":
            times[name] = None
            continue
        try:
            moment = float(when(name, value))
        except (TypeError, ValueError) as exc:
            raise BadFilter(name, str(exc)) from None
        if not math.isfinite(moment):
            raise BadFilter(name, "must be a time")
        times[name] = moment
    since, until = times["since"], times["until"]
    if since is not None and until is not None and until <= since:
        raise BadFilter("until", "must be after since")
    return RedeliveryFilter(
        status=status,
        sinks=tuple(dict.fromkeys(chosen)),
        event=text["event"],
        job_id=text["job_id"],
        since=since,
        until=until,
        event_id=text["event_id"],
        error=text["error"],
    )
