"""The records the inbox hands out and takes in: events, deliveries, snapshots and outcomes.

An *event* is one verified webhook, stored with its raw body before the receiver answers 2xx; each
event has one *delivery* per sink that wants it (see :mod:`receiver.store.base` for the whole
story). This module imports nothing else of the store: the interface, the rules and every backend
build on it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import orjson


def headers_json(headers: Mapping[str, str]) -> str:
    """An event's kept headers as stored: compact JSON (written for every webhook stored, so
    with orjson, in a tenth of json.dumps' time)."""
    return orjson.dumps(headers if isinstance(headers, dict) else dict(headers)).decode()


DeliveryState = Literal["pending", "done", "dead", "skipped"]
EventState = Literal["pending", "done", "dead"]
EVENT_STATES: tuple[EventState, ...] = ("pending", "done", "dead")


# Not frozen: intake builds one for every webhook, and a frozen dataclass sets each field through
# object.__setattr__ (three times the time). Nothing changes one after it is built.
@dataclass
class NewEvent:
    """A verified webhook about to be stored, with the sinks that get a delivery row."""

    id: str
    event: str
    job_id: str
    body: bytes
    headers: Mapping[str, str]
    received_at: float
    sinks: tuple[str, ...]
    #: ``webhook``, or ``poll``/``reconcile`` for events the receiver made (receiver.store.pull)
    source: str = "webhook"
    #: The W3C traceparent of the span that stored it (tracing on), continued by its processing.
    trace: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """The fresh job and assets fetched for an event, shared by all of its deliveries."""

    job: Mapping[str, Any]
    assets: tuple[Mapping[str, Any], ...]
    fetched_at: float

    def to_json(self) -> str:
        return json.dumps(
            {"job": self.job, "assets": list(self.assets)},
            separators=(",", ":"),
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str | bytes, fetched_at: float) -> Snapshot:
        data = json.loads(text)
        return cls(job=data["job"], assets=tuple(data["assets"]), fetched_at=fetched_at)


@dataclass(frozen=True)
class DeliveryRecord:
    event_id: str
    sink: str
    state: DeliveryState
    attempts: int
    next_attempt_at: float | None
    last_error: str | None
    updated_at: float
    leased_until: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "sink": self.sink,
            "state": self.state,
            "attempts": self.attempts,
            "next_attempt_at": self.next_attempt_at,
            "last_error": self.last_error,
            "updated_at": self.updated_at,
            "leased_until": self.leased_until,
        }


@dataclass(frozen=True)
class EventRecord:
    id: str
    event: str
    job_id: str
    body: bytes
    headers: Mapping[str, str]
    received_at: float
    state: EventState
    deliveries: tuple[DeliveryRecord, ...] = ()
    snapshot: Snapshot | None = None
    # Enrichment: due at ``enrich_at`` while no snapshot was stored yet, None once one was
    # (or enrichment gave up); attempts made and the last error.
    enrich_at: float | None = None
    enrich_attempts: int = 0
    enrich_error: str | None = None
    #: The traceparent stored with the event (see NewEvent.trace), and when it was written.
    trace: str | None = None
    stored_at: float | None = None

    def payload(self) -> dict[str, Any]:
        """The webhook body, parsed (it was validated as a JSON object at intake)."""
        value = json.loads(self.body)
        assert isinstance(value, dict)
        return value

    def as_json(self, *, with_body: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "event": self.event,
            "job_id": self.job_id,
            "state": self.state,
            "received_at": self.received_at,
            "stored_at": self.stored_at,
            "traceparent": self.trace,
            "enrichment": {
                "fetched_at": self.snapshot.fetched_at if self.snapshot else None,
                "attempts": self.enrich_attempts,
                "next_attempt_at": self.enrich_at,
                "last_error": self.enrich_error,
            },
            "deliveries": [d.as_json() for d in self.deliveries],
        }
        if with_body:
            out["headers"] = dict(self.headers)
            out["payload"] = self.payload()
        return out


# The column orders the SQL backends select in, so one function maps rows to records.
EVENT_COLUMNS = (
    "id, event, job_id, body, headers, received_at, state, "
    "snapshot, fetched_at, enrich_at, enrich_attempts, enrich_error, trace, stored_at"
)
DELIVERY_COLUMNS = (
    "event_id, sink, state, attempts, next_attempt_at, last_error, updated_at, lease_expires_at"
)


def delivery_record(d: Sequence[Any]) -> DeliveryRecord:
    """A record from a row in ``DELIVERY_COLUMNS`` order."""
    return DeliveryRecord(
        event_id=d[0],
        sink=d[1],
        state=d[2],
        attempts=d[3],
        next_attempt_at=d[4],
        last_error=d[5],
        updated_at=d[6],
        leased_until=d[7],
    )


def event_records(
    rows: Sequence[Sequence[Any]], delivery_rows: Iterable[Sequence[Any]]
) -> list[EventRecord]:
    """Records from event rows (``EVENT_COLUMNS`` first, headers and snapshot as JSON text) and
    the rows of their deliveries (``DELIVERY_COLUMNS``), each event's deliveries in the order
    given."""
    by_event: dict[str, list[DeliveryRecord]] = {}
    for d in delivery_rows:
        by_event.setdefault(d[0], []).append(delivery_record(d))
    return [
        EventRecord(
            id=row[0],
            event=row[1],
            job_id=row[2],
            body=bytes(row[3]),
            headers=json.loads(row[4]),
            received_at=row[5],
            state=row[6],
            deliveries=tuple(by_event.get(row[0], ())),
            snapshot=Snapshot.from_json(row[7], row[8]) if row[7] is not None else None,
            enrich_at=row[9],
            enrich_attempts=row[10],
            enrich_error=row[11],
            trace=row[12],
            stored_at=row[13],
        )
        for row in rows
    ]


@dataclass(frozen=True)
class Outcome:
    """How one delivery attempt ended, as the worker settles it.

    ``state`` is the delivery's new state; ``next_attempt_at`` is required for ``pending``.
    ``attempted`` is False for a skip, which does not count as an attempt.
    """

    state: DeliveryState
    error: str | None = None
    next_attempt_at: float | None = None
    attempted: bool = True


class PruneStep(NamedTuple):
    """What one prune step did: the events it deleted, and how long its statements ran (the
    time it held the writer, not the time it waited for its turn)."""

    deleted: int
    seconds: float
