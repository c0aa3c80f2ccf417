"""An in-memory inbox with the same semantics as the SQL stores, for unit tests."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence

from receiver.config import StoreSettings
from receiver.errors import StoreUnavailable, UnknownEvent
from receiver.store import rules
from receiver.store.asset_ledger import LedgerEntry
from receiver.store.lanes_model import (
    LaneClaim,
    LanePolicy,
    LaneResult,
    LaneState,
    LaneStats,
    Leased,
    Leases,
    leased,
)
from receiver.store.memory.browse import MemoryBrowse
from receiver.store.memory.pull import MemoryPull
from receiver.store.memory.records import MemoryDelivery, MemoryEvent, reset_deliveries
from receiver.store.records import (
    EVENT_STATES,
    EventRecord,
    EventState,
    NewEvent,
    Outcome,
    Snapshot,
)


class MemoryStore(MemoryPull, MemoryBrowse):
    """An inbox kept in a dict: the fake for unit tests, with the SQL stores' semantics.

    It works without :meth:`open` (forgiving for tests) but refuses calls after :meth:`close`
    until opened again; the data survives close/open within the process. Set
    :attr:`unavailable` to a message to make every call raise StoreUnavailable (to test 503s).
    """

    def __init__(self, settings: StoreSettings | None = None) -> None:
        super().__init__()
        self.settings = settings or StoreSettings(url="memory://")
        self.unavailable: str | None = None
        self._events: dict[str, MemoryEvent] = {}
        self._lanes: dict[str, LaneState] = {}
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
        rules.refuse_unstorable((event.id, event.event, event.job_id))
        if event.id in self._events or not self._admit(event):
            return False
        sinks = tuple(dict.fromkeys(event.sinks))
        state, enrich_at = rules.new_event_values(bool(sinks), event.received_at)
        ev = MemoryEvent(seq=next(self._seq), new=event, state=state, enrich_at=enrich_at)
        for sink in sinks:
            ev.deliveries[sink] = MemoryDelivery(
                sink=sink,
                state="pending",
                attempts=0,
                next_attempt_at=event.received_at,
                last_error=None,
                updated_at=event.received_at,
            )
        self._events[event.id] = ev
        return True

    def _event(self, event_id: str) -> MemoryEvent:
        ev = self._events.get(event_id)
        if ev is None:
            raise UnknownEvent(f"no event {event_id!r} in the inbox")
        return ev

    # -- enrichment -----------------------------------------------------------------------------

    async def claim_enrichment(
        self, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> list[EventRecord]:
        self._check()
        due = [
            ev
            for ev in self._events.values()
            if rules.is_due(ev.enrich_at, now) and rules.lease_free(ev.lease_expires_at, now)
        ]
        due.sort(key=lambda ev: (ev.enrich_at or 0.0, ev.seq))
        claimed = []
        for ev in due[: max(limit, 0)]:
            ev.lease_owner, ev.lease_expires_at = owner, now + lease_seconds
            claimed.append(ev.record())
        return claimed

    async def save_snapshot(
        self,
        event_id: str,
        snapshot: Snapshot,
        *,
        finished: Mapping[str, Outcome] | None = None,
        ledger: Sequence[LedgerEntry] = (),
        now: float,
    ) -> EventState:
        self._check()
        ev = self._event(event_id)
        if ev.snapshot is None or ev.snapshot.fetched_at <= snapshot.fetched_at:
            ev.snapshot = snapshot  # a refetched snapshot never replaces a newer one
            ev.enrich_at = None
            ev.enrich_error = None
            ev.lease_owner = ev.lease_expires_at = None
        self._record_ledger(event_id, ledger)
        for sink, outcome in (finished or {}).items():
            d = ev.deliveries.get(sink)
            if d is not None and d.state == "pending":
                d.settle(outcome, now)
        ev.recompute()
        return ev.state

    async def fail_enrichment(
        self, event_id: str, *, error: str, retry_at: float | None, now: float
    ) -> EventState:
        self._check()
        ev = self._event(event_id)
        ev.enrich_attempts += 1
        ev.enrich_error = error
        ev.enrich_at = retry_at
        ev.lease_owner = ev.lease_expires_at = None
        outcome = rules.enrichment_failed(error, retry_at)
        for d in ev.deliveries.values():
            if d.state == "pending":
                d.settle(outcome, now)
        ev.recompute()
        return ev.state

    # -- lanes ----------------------------------------------------------------------------------

    async def claim_deliveries(
        self, policy: LanePolicy, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> LaneClaim:
        self._check()
        state = self._lanes.get(policy.sink) or rules.fresh_lane(policy, now)
        granted = rules.grant(policy, state, now, limit)
        waiting = self._waiting(policy.sink, now)
        due = sorted(
            (d.next_attempt_at or 0.0, ev.new.id, ev, d)
            for ev, d in waiting
            if rules.is_due(d.next_attempt_at, now)
        )
        taken: list[Leased] = []
        for _at, _id, ev, d in due[: granted.count]:
            d.lease_owner, d.lease_expires_at = owner, now + lease_seconds
            record = ev.record()
            taken.append(leased(record, d.sink))
        new_state, held = rules.after_claim(policy, granted, len(taken), now, lease_seconds)
        self._lanes[policy.sink] = new_state
        retry_at = held
        if len(taken) < granted.count:
            later = [d.next_attempt_at for _ev, d in waiting if d.next_attempt_at is not None]
            retry_at = rules.earliest(held, min((t for t in later if t > now), default=None))
        return LaneClaim(tuple(taken), retry_at, held)

    def _waiting(self, sink: str, now: float) -> list[tuple[MemoryEvent, MemoryDelivery]]:
        """Pending, unleased deliveries of ``sink`` whose event has its snapshot."""
        found = []
        for ev in self._events.values():
            d = ev.deliveries.get(sink)
            if (
                d is not None
                and d.state == "pending"
                and ev.snapshot is not None
                and rules.lease_free(d.lease_expires_at, now)
            ):
                found.append((ev, d))
        return found

    async def lane_stats(self, *, now: float) -> dict[str, LaneStats]:
        self._check()
        stats: dict[str, LaneStats] = {}
        for ev in self._events.values():
            for d in ev.deliveries.values():
                if d.state != "pending":
                    continue
                s = stats.get(d.sink, LaneStats())
                if not rules.lease_free(d.lease_expires_at, now):
                    s = LaneStats(s.backlog, s.oldest_due, s.in_flight + 1)
                elif ev.snapshot is not None and rules.is_due(d.next_attempt_at, now):
                    oldest = rules.earliest(s.oldest_due, d.next_attempt_at)
                    s = LaneStats(s.backlog + 1, oldest, s.in_flight)
                stats[d.sink] = s
        return stats

    # -- leases ---------------------------------------------------------------------------------

    async def extend_leases(
        self, leases: Leases, *, owner: str, lease_seconds: float, now: float
    ) -> None:
        self._check()
        for held in self._held(leases, owner):
            held.lease_expires_at = now + lease_seconds

    async def release(self, leases: Leases, *, owner: str) -> None:
        self._check()
        for held in self._held(leases, owner):
            held.lease_owner = held.lease_expires_at = None

    def _held(self, leases: Leases, owner: str) -> Iterable[MemoryEvent | MemoryDelivery]:
        for event_id in leases.events:
            ev = self._events.get(event_id)
            if ev is not None and ev.lease_owner == owner:
                yield ev
        for key in leases.deliveries:
            ev = self._events.get(key.event_id)
            d = ev.deliveries.get(key.sink) if ev is not None else None
            if d is not None and d.lease_owner == owner:
                yield d

    # -- settling -------------------------------------------------------------------------------

    async def settle(
        self,
        event_id: str,
        sink: str,
        outcome: Outcome,
        *,
        now: float,
        lane: LaneResult | None = None,
    ) -> EventState:
        self._check()
        ev = self._events.get(event_id)
        delivery = ev.deliveries.get(sink) if ev is not None else None
        if ev is None or delivery is None:
            raise UnknownEvent(f"no delivery {sink!r} for event {event_id!r}")
        delivery.settle(outcome, now)
        ev.recompute()
        if lane is not None:
            state = self._lanes.get(sink) or rules.fresh_lane(lane.policy, now)
            changed = rules.after_result(state, lane, now)
            if changed is not None:
                self._lanes[sink] = changed
        return ev.state

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
        ev = self._event(event_id)
        count = reset_deliveries(ev, ev.deliveries.values(), now)
        return count

    async def redeliver_dead(self, *, now: float) -> int:
        self._check()
        count = 0
        for ev in self._events.values():
            dead = [d for d in ev.deliveries.values() if d.state == "dead"]
            if dead:
                count += reset_deliveries(ev, dead, now)
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
