"""An in-memory inbox with the same semantics as the SQLite store, for unit tests."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from receiver.config import StoreSettings
from receiver.errors import StoreUnavailable, UnknownEvent
from receiver.store.base import (
    EVENT_STATES,
    Claim,
    DeliveryRecord,
    DeliveryState,
    EventRecord,
    EventState,
    NewEvent,
    Outcome,
)
from receiver.store.memory_pull import MemoryPull


@dataclass
class _Delivery:
    sink: str
    state: DeliveryState
    attempts: int
    next_attempt_at: float | None
    last_error: str | None
    updated_at: float


@dataclass
class _Event:
    seq: int
    new: NewEvent
    state: EventState
    next_attempt_at: float | None
    deliveries: dict[str, _Delivery] = field(default_factory=dict)
    lease_owner: str | None = None
    lease_expires_at: float | None = None

    def recompute(self) -> None:
        pending = [d for d in self.deliveries.values() if d.state == "pending"]
        if pending:
            self.state = "pending"
            self.next_attempt_at = min(d.next_attempt_at or 0.0 for d in pending)
            return
        self.next_attempt_at = None
        dead = any(d.state == "dead" for d in self.deliveries.values())
        self.state = "dead" if dead else "done"

    def record(self) -> EventRecord:
        e = self.new
        deliveries = tuple(
            DeliveryRecord(
                event_id=e.id,
                sink=d.sink,
                state=d.state,
                attempts=d.attempts,
                next_attempt_at=d.next_attempt_at,
                last_error=d.last_error,
                updated_at=d.updated_at,
            )
            for d in sorted(self.deliveries.values(), key=lambda d: d.sink)
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
        )


class MemoryStore(MemoryPull):
    """An inbox kept in a dict: the fake for unit tests, with the SQLite store's semantics.

    It works without :meth:`open` (forgiving for tests) but refuses calls after :meth:`close`
    until opened again; the data survives close/open within the process. Set
    :attr:`unavailable` to a message to make every call raise StoreUnavailable (to test 503s).
    """

    def __init__(self, settings: StoreSettings | None = None) -> None:
        super().__init__()
        self.settings = settings or StoreSettings(url="memory://")
        self.unavailable: str | None = None
        self._events: dict[str, _Event] = {}
        self._seq = itertools.count()
        self._closed = False

    def _check(self) -> None:
        if self.unavailable is not None:
            raise StoreUnavailable(self.unavailable)
        if self._closed:
            raise StoreUnavailable("the inbox is closed")

    async def open(self) -> None:
        self._closed = False

    async def close(self) -> None:
        self._closed = True

    async def ping(self) -> None:
        self._check()

    async def add_event(self, event: NewEvent) -> bool:
        self._check()
        if event.id in self._events or not self._admit(event):
            return False
        sinks = tuple(dict.fromkeys(event.sinks))
        ev = _Event(
            seq=next(self._seq),
            new=event,
            state="pending" if sinks else "done",
            next_attempt_at=event.received_at if sinks else None,
        )
        for sink in sinks:
            ev.deliveries[sink] = _Delivery(
                sink=sink,
                state="pending",
                attempts=0,
                next_attempt_at=event.received_at,
                last_error=None,
                updated_at=event.received_at,
            )
        self._events[event.id] = ev
        return True

    async def claim(
        self, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> list[Claim]:
        self._check()
        due = [
            ev
            for ev in self._events.values()
            if ev.state == "pending"
            and ev.next_attempt_at is not None
            and ev.next_attempt_at <= now
            and (ev.lease_expires_at is None or ev.lease_expires_at < now)
        ]
        due.sort(key=lambda ev: (ev.next_attempt_at or 0.0, ev.seq))
        claims = []
        for ev in due[: max(limit, 0)]:
            ev.lease_owner = owner
            ev.lease_expires_at = now + lease_seconds
            record = ev.record()
            ready = tuple(
                d
                for d in record.deliveries
                if d.state == "pending" and (d.next_attempt_at or 0.0) <= now
            )
            claims.append(Claim(event=record, due=ready, owner=owner))
        return claims

    async def extend_lease(
        self, event_ids: list[str], *, owner: str, lease_seconds: float, now: float
    ) -> None:
        self._check()
        for ev in self._owned(event_ids, owner):
            ev.lease_expires_at = now + lease_seconds

    async def release(self, event_ids: list[str], *, owner: str) -> None:
        self._check()
        for ev in self._owned(event_ids, owner):
            ev.lease_owner = None
            ev.lease_expires_at = None

    def _owned(self, event_ids: Iterable[str], owner: str) -> list[_Event]:
        events = (self._events.get(event_id) for event_id in event_ids)
        return [ev for ev in events if ev is not None and ev.lease_owner == owner]

    async def settle(self, event_id: str, sink: str, outcome: Outcome, *, now: float) -> None:
        self._check()
        ev = self._events.get(event_id)
        delivery = ev.deliveries.get(sink) if ev is not None else None
        if ev is None or delivery is None:
            raise UnknownEvent(f"no delivery {sink!r} for event {event_id!r}")
        delivery.state = outcome.state
        if outcome.attempted:
            delivery.attempts += 1
        if outcome.state == "pending":
            nxt = outcome.next_attempt_at
            delivery.next_attempt_at = now if nxt is None else nxt
        else:
            delivery.next_attempt_at = None
        delivery.last_error = None if outcome.state == "done" else outcome.error
        delivery.updated_at = now
        ev.recompute()

    async def get(self, event_id: str) -> EventRecord | None:
        self._check()
        ev = self._events.get(event_id)
        return ev.record() if ev is not None else None

    async def list(
        self, *, state: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[EventRecord]:
        self._check()
        events = [ev for ev in self._events.values() if state is None or ev.state == state]
        events.sort(key=lambda ev: (ev.new.received_at, ev.seq), reverse=True)
        start = max(offset, 0)
        return [ev.record() for ev in events[start : start + max(limit, 0)]]

    async def redeliver(self, event_id: str, *, now: float) -> int:
        self._check()
        ev = self._events.get(event_id)
        if ev is None:
            raise UnknownEvent(f"no event {event_id!r} in the inbox")
        count = self._reset(ev, ev.deliveries.values(), now)
        ev.recompute()
        return count

    async def redeliver_dead(self, *, now: float) -> int:
        self._check()
        count = 0
        for ev in self._events.values():
            dead = [d for d in ev.deliveries.values() if d.state == "dead"]
            if dead:
                count += self._reset(ev, dead, now)
                ev.recompute()
        return count

    @staticmethod
    def _reset(ev: _Event, deliveries: Iterable[_Delivery], now: float) -> int:
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
        return count

    async def prune(self, *, older_than: float, batch: int = 1000) -> int:
        self._check()
        doomed = [
            ev.new.id
            for ev in self._events.values()
            if ev.state == "done" and ev.new.received_at < older_than
        ]
        for event_id in doomed:
            del self._events[event_id]
        return len(doomed)

    async def counts(self) -> tuple[dict[str, int], float | None]:
        self._check()
        counts: dict[str, int] = dict.fromkeys(EVENT_STATES, 0)
        oldest: float | None = None
        for ev in self._events.values():
            counts[ev.state] += 1
            if ev.state == "pending" and (oldest is None or ev.new.received_at < oldest):
                oldest = ev.new.received_at
        return counts, oldest

    def on_new_events(self, callback: Callable[[], None]) -> None:
        """Nothing to do: every writer shares this process."""
