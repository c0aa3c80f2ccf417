"""The memory store's rows: an event with its deliveries, kept as mutable records, and the
tables every part of :class:`~receiver.store.memory.store.MemoryStore` shares."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from receiver.errors import StoreUnavailable, UnknownEvent
from receiver.store import rules
from receiver.store.lanes_model import LaneState
from receiver.store.records import (
    DeliveryRecord,
    DeliveryState,
    EventRecord,
    EventState,
    NewEvent,
    Outcome,
    Snapshot,
)
from receiver.store.steps import MAX_STEPS_PER_DELIVERY, Step


@dataclass(frozen=True)
class Enrichment:
    """An event's enrichment state: when its job is fetched next, attempts, last error."""

    enrich_at: float | None
    enrich_attempts: int
    enrich_error: str | None


@dataclass(frozen=True)
class BeforeBatch:
    """What a delivery was before the batch ``batch`` queued it (the SQL stores' JSON
    ``before_batch``, :mod:`receiver.store.sql.withdraw`): put back if the batch is cancelled
    before a lane takes it."""

    batch: str
    state: DeliveryState
    attempts: int
    next_attempt_at: float | None
    last_error: str | None
    updated_at: float
    batch_id: str | None
    before: BeforeBatch | None
    event: Enrichment | None


@dataclass
class MemoryDelivery:
    sink: str
    state: DeliveryState
    attempts: int
    next_attempt_at: float | None
    last_error: str | None
    updated_at: float
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    before_batch: BeforeBatch | None = None

    def settle(self, outcome: Outcome, now: float) -> None:
        values = rules.settle_values(outcome, now)
        self.state = values.state
        self.attempts += values.attempts_add
        self.next_attempt_at = values.next_attempt_at
        self.last_error = values.last_error
        self.updated_at = now
        self.lease_owner = self.lease_expires_at = None


@dataclass
class MemoryEvent:
    seq: int
    new: NewEvent
    state: EventState
    enrich_at: float | None
    deliveries: dict[str, MemoryDelivery] = field(default_factory=dict)
    snapshot: Snapshot | None = None
    enrich_attempts: int = 0
    enrich_error: str | None = None
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    stored_at: float | None = None
    #: The event's timeline by delivery ("" for its own fetches), the newest kept.
    steps: dict[str, deque[Step]] = field(default_factory=dict)

    def add_steps(self, steps: Iterable[Step]) -> None:
        for step in steps:
            kept = self.steps.get(step.sink)
            if kept is None:
                kept = self.steps[step.sink] = deque(maxlen=MAX_STEPS_PER_DELIVERY)
            kept.append(step)

    def recompute(self) -> None:
        self.state = rules.event_state(d.state for d in self.deliveries.values())

    def delivery_record(self, d: MemoryDelivery) -> DeliveryRecord:
        return DeliveryRecord(
            event_id=self.new.id,
            sink=d.sink,
            state=d.state,
            attempts=d.attempts,
            next_attempt_at=d.next_attempt_at,
            last_error=d.last_error,
            updated_at=d.updated_at,
            leased_until=d.lease_expires_at,
        )

    def record(self) -> EventRecord:
        e = self.new
        deliveries = tuple(
            self.delivery_record(d) for d in sorted(self.deliveries.values(), key=lambda d: d.sink)
        )
        return EventRecord(
            id=e.id,
            event=e.event,
            job_id=e.job_id,
            body=e.body,
            headers=dict(e.headers),
            received_at=e.received_at,
            state=self.state,
            deliveries=deliveries,
            snapshot=self.snapshot,
            enrich_at=self.enrich_at,
            enrich_attempts=self.enrich_attempts,
            enrich_error=self.enrich_error,
            trace=e.trace,
            stored_at=self.stored_at,
        )


def reset_deliveries(ev: MemoryEvent, deliveries: Iterable[MemoryDelivery], now: float) -> int:
    """Make ``deliveries`` of ``ev`` pending and due ``now`` (skipped ones stay); how many.

    An event without a job snapshot is due for enrichment again."""
    count = 0
    for d in deliveries:
        if d.state == "skipped":
            continue
        d.state = "pending"
        d.attempts = 0
        d.next_attempt_at = now
        d.last_error = None
        d.updated_at = now
        count += 1
    if count and ev.snapshot is None:
        ev.enrich_at, ev.enrich_attempts, ev.enrich_error = now, 0, None
    ev.recompute()
    return count


class MemoryTables:
    """What the memory store's parts (intake, lanes, browse, pull) share: the events by id, the
    lanes' state by sink, and the store's availability."""

    def __init__(self) -> None:
        self.unavailable: str | None = None
        self._events: dict[str, MemoryEvent] = {}
        self._lanes: dict[str, LaneState] = {}
        self._seq = itertools.count()
        self._closed = False

    def _check(self) -> None:
        """Raise StoreUnavailable once closed, or while :attr:`unavailable` says why."""
        if self.unavailable is not None:
            raise StoreUnavailable(self.unavailable)
        if self._closed:
            raise StoreUnavailable("the inbox is closed")

    def _event(self, event_id: str) -> MemoryEvent:
        ev = self._events.get(event_id)
        if ev is None:
            raise UnknownEvent(f"no event {event_id!r} in the inbox")
        return ev
