"""The inbox interface every store backend implements, and the records it hands out.

An *event* is one verified webhook, stored with its raw body before the receiver answers 2xx. Each
event has one *delivery* per sink that wants it; deliveries carry their own state, attempt count
and next attempt time, so each sink retries on its own.

Delivery states: ``pending`` (due at ``next_attempt_at``), ``done``, ``dead`` (gave up; can be
redelivered), ``skipped`` (the fresh job showed the sink's filter does not match).

An event's state is derived from its deliveries: ``pending`` while any delivery is pending,
else ``dead`` if any is dead, else ``done``.

Workers *claim* events with a lease. A claim is released when the worker has settled its due
deliveries; a worker that dies loses its claims when the lease expires and another worker picks
the event up again (at-least-once processing).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from receiver.store.pull import PullStore

DeliveryState = Literal["pending", "done", "dead", "skipped"]
EventState = Literal["pending", "done", "dead"]
EVENT_STATES: tuple[EventState, ...] = ("pending", "done", "dead")


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class DeliveryRecord:
    event_id: str
    sink: str
    state: DeliveryState
    attempts: int
    next_attempt_at: float | None
    last_error: str | None
    updated_at: float

    def as_json(self) -> dict[str, Any]:
        return {
            "sink": self.sink,
            "state": self.state,
            "attempts": self.attempts,
            "next_attempt_at": self.next_attempt_at,
            "last_error": self.last_error,
            "updated_at": self.updated_at,
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
            "deliveries": [d.as_json() for d in self.deliveries],
        }
        if with_body:
            out["headers"] = dict(self.headers)
            out["payload"] = self.payload()
        return out


# The column orders the SQL backends select in, so one function maps rows to records.
EVENT_COLUMNS = "id, event, job_id, body, headers, received_at, state"


def event_records(
    rows: Sequence[Sequence[Any]], delivery_rows: Iterable[Sequence[Any]]
) -> list[EventRecord]:
    """Records from event rows (EVENT_COLUMNS first, headers as JSON text) and the rows of their
    deliveries (event_id, sink, state, attempts, next_attempt_at, last_error, updated_at), each
    event's deliveries in the order given."""
    by_event: dict[str, list[DeliveryRecord]] = {}
    for d in delivery_rows:
        by_event.setdefault(d[0], []).append(
            DeliveryRecord(
                event_id=d[0],
                sink=d[1],
                state=d[2],
                attempts=d[3],
                next_attempt_at=d[4],
                last_error=d[5],
                updated_at=d[6],
            )
        )
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
        )
        for row in rows
    ]


@dataclass(frozen=True)
class Claim:
    """An event leased to one worker, with the deliveries that are due now."""

    event: EventRecord
    due: tuple[DeliveryRecord, ...]
    owner: str


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


class Store(PullStore, Protocol):
    """The inbox. Every method is safe to call concurrently from one event loop.

    The watch list and the job-outcome ledger of pull mode are :class:`PullStore`'s half.

    Methods raise :class:`~receiver.errors.StoreUnavailable` when the backend cannot be reached
    or written, never a driver exception.
    """

    async def open(self) -> None:
        """Connect, create or migrate the schema."""

    async def close(self) -> None:
        """Finish pending writes and disconnect."""

    async def ping(self) -> None:
        """Raise StoreUnavailable unless the store answers a trivial query."""

    async def add_event(self, event: NewEvent) -> bool:
        """Store the event and its delivery rows durably; False if its id was already stored.

        Returns only after the commit: a 2xx may be sent the moment this returns.
        """

    async def claim(
        self, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> list[Claim]:
        """Lease up to ``limit`` events with a due delivery that nobody else holds."""

    async def extend_lease(
        self, event_ids: list[str], *, owner: str, lease_seconds: float, now: float
    ) -> None:
        """Push the lease of events this owner still holds."""

    async def settle(self, event_id: str, sink: str, outcome: Outcome, *, now: float) -> None:
        """Record the result of one delivery attempt and update the event's state."""

    async def release(self, event_ids: list[str], *, owner: str) -> None:
        """Drop this owner's leases so the events can be claimed again at once."""

    async def get(self, event_id: str) -> EventRecord | None:
        """One event with its deliveries, or None."""

    async def list(
        self, *, state: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[EventRecord]:
        """Events newest first, optionally only those in ``state``."""

    async def redeliver(self, event_id: str, *, now: float) -> int:
        """Make every non-skipped delivery of the event pending and due now.

        Returns how many deliveries were reset; raises UnknownEvent for an unknown id.
        """

    async def redeliver_dead(self, *, now: float) -> int:
        """Make every dead delivery pending and due now; returns how many."""

    async def prune(self, *, older_than: float, batch: int = 1000) -> int:
        """Delete finished (``done``) events received before ``older_than``; returns how many."""

    async def counts(self) -> tuple[dict[str, int], float | None]:
        """Events per state, and the receipt time of the oldest pending event (or None)."""

    def on_new_events(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when another process adds events (backends that can tell)."""
