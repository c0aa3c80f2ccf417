"""The memory store's enrichment, delivery claims, leases and settling (the rules of
:mod:`receiver.store.rules`, on the rows of :mod:`.records`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from receiver.errors import UnknownEvent
from receiver.store import rules
from receiver.store.asset_ledger import LedgerEntry
from receiver.store.lanes_model import (
    LaneClaim,
    LanePolicy,
    LaneResult,
    LaneStats,
    Leased,
    Leases,
    leased,
)
from receiver.store.memory.pull import MemoryPull
from receiver.store.memory.records import MemoryDelivery, MemoryEvent
from receiver.store.records import EventRecord, EventState, Outcome, Snapshot
from receiver.store.steps import Step


class MemoryLanes(MemoryPull):
    """Enrichment, lane claims, leases and settling of the memory store."""

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
        steps: Sequence[Step] = (),
    ) -> EventState:
        self._check()
        ev = self._event(event_id)
        ev.add_steps(steps)
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
        self,
        event_id: str,
        *,
        error: str,
        retry_at: float | None,
        now: float,
        steps: Sequence[Step] = (),
    ) -> EventState:
        self._check()
        ev = self._event(event_id)
        ev.add_steps(steps)
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

    async def pending_sinks(self) -> set[str]:
        self._check()
        return {
            d.sink
            for ev in self._events.values()
            for d in ev.deliveries.values()
            if d.state == "pending"
        }

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
        steps: Sequence[Step] = (),
    ) -> EventState:
        self._check()
        ev = self._events.get(event_id)
        delivery = ev.deliveries.get(sink) if ev is not None else None
        if ev is None or delivery is None:
            raise UnknownEvent(f"no delivery {sink!r} for event {event_id!r}")
        delivery.settle(outcome, now)
        ev.add_steps(steps)
        ev.recompute()
        if lane is not None:
            state = self._lanes.get(sink) or rules.fresh_lane(lane.policy, now)
            changed = rules.after_result(state, lane, now)
            if changed is not None:
                self._lanes[sink] = changed
        return ev.state
