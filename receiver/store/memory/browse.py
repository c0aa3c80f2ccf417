"""The memory store's reads and prunes, and the inbox page's queries (see
:mod:`receiver.store.browse`)."""

from __future__ import annotations

from receiver.store import rules
from receiver.store.browse import (
    Cursor,
    DeadGroup,
    DeadGroupList,
    EventList,
    EventQuery,
    InboxOverview,
    lane_counts,
    matches,
)
from receiver.store.memory.batches import MemoryBatches
from receiver.store.records import EVENT_STATES, DeliveryRecord, EventRecord, PruneStep
from receiver.store.space import InboxSpace
from receiver.store.steps import Step, in_order


class MemoryBrowse(MemoryBatches):
    """Reads, redelivery batches, prunes and the inbox page of the memory store."""

    async def get(self, event_id: str) -> EventRecord | None:
        self._check()
        ev = self._events.get(event_id)
        return ev.record() if ev is not None else None

    async def event_steps(self, event_id: str) -> list[Step]:
        self._check()
        ev = self._events.get(event_id)
        return [] if ev is None else in_order(s for kept in ev.steps.values() for s in kept)

    async def list(
        self, *, state: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[EventRecord]:
        self._check()
        events = [ev for ev in self._events.values() if state is None or ev.state == state]
        events.sort(key=lambda ev: (ev.new.received_at, ev.seq), reverse=True)
        start = max(offset, 0)
        return [ev.record() for ev in events[start : start + max(limit, 0)]]

    async def prune(self, *, older_than: float, batch: int = 1000) -> int:
        return (await self.prune_step(older_than=older_than, limit=len(self._events))).deleted

    async def prune_step(self, *, older_than: float, limit: int) -> PruneStep:
        self._check()
        doomed = [
            ev.new.id
            for ev in self._events.values()
            if ev.state == "done" and ev.new.received_at < older_than
        ][: max(limit, 0)]
        for event_id in doomed:
            del self._events[event_id]
        return PruneStep(len(doomed), 0.0)

    async def space(self) -> InboxSpace | None:
        return None

    async def reclaim_space(self, *, max_pages: int) -> int:
        return 0

    async def counts(self) -> tuple[dict[str, int], float | None]:
        self._check()
        counts: dict[str, int] = dict.fromkeys(EVENT_STATES, 0)
        oldest: float | None = None
        for ev in self._events.values():
            counts[ev.state] += 1
            if ev.state == "pending" and (oldest is None or ev.new.received_at < oldest):
                oldest = ev.new.received_at
        return counts, oldest

    # -- reading for people (receiver.store.browse) ---------------------------------------------

    async def browse(
        self,
        query: EventQuery,
        *,
        before: Cursor | None = None,
        after: Cursor | None = None,
        limit: int = 50,
    ) -> EventList:
        self._check()
        found = [
            ev
            for ev in self._events.values()
            if matches(
                query,
                event_id=ev.new.id,
                event=ev.new.event,
                job_id=ev.new.job_id,
                state=ev.state,
                received_at=ev.new.received_at,
                deliveries={d.sink: d.state for d in ev.deliveries.values()},
            )
        ]
        found.sort(key=lambda ev: (ev.new.received_at, ev.new.id), reverse=True)
        if after is not None:
            newer = [ev for ev in found if (ev.new.received_at, ev.new.id) > _key(after)]
            page = newer[-max(limit, 0) :] if limit > 0 else []
        else:
            if before is not None:
                found = [ev for ev in found if (ev.new.received_at, ev.new.id) < _key(before)]
            page = found[: max(limit, 0)]
        return [ev.record() for ev in page]

    async def overview(
        self, *, now: float, failing_since: float, errors: int = 10
    ) -> InboxOverview:
        self._check()
        pending: dict[str, list[float]] = {}
        in_flight: dict[str, int] = {}
        failing: dict[str, int] = {}
        failed: list[DeliveryRecord] = []
        for ev in self._events.values():
            for d in ev.deliveries.values():
                if d.state == "pending":
                    due_at = d.next_attempt_at if d.next_attempt_at is not None else now
                    pending.setdefault(d.sink, []).append(due_at)
                    if not rules.lease_free(d.lease_expires_at, now):
                        in_flight[d.sink] = in_flight.get(d.sink, 0) + 1
                if d.last_error is not None:
                    failed.append(ev.delivery_record(d))
                    if d.updated_at >= failing_since:
                        failing[d.sink] = failing.get(d.sink, 0) + 1
        failed.sort(key=lambda d: d.updated_at, reverse=True)
        rows = [
            (sink, len(times), min(times), sum(t <= now for t in times), in_flight.get(sink, 0))
            for sink, times in pending.items()
        ]
        return InboxOverview(
            lanes=lane_counts(rows, failing.items()),
            recent_errors=tuple(failed[: max(errors, 0)]),
        )

    async def dead_letters(self, *, groups: int = 100, samples: int = 5) -> DeadGroupList:
        self._check()
        found: dict[tuple[str, str | None], list[tuple[float, str]]] = {}
        for ev in self._events.values():
            for d in ev.deliveries.values():
                if d.state == "dead":
                    found.setdefault((d.sink, d.last_error), []).append((d.updated_at, ev.new.id))
        out = [
            DeadGroup(
                sink=sink,
                error=error,
                count=len(rows),
                first_at=min(rows)[0],
                last_at=max(rows)[0],
                event_ids=tuple(i for _, i in sorted(rows, reverse=True)[: max(samples, 0)]),
            )
            for (sink, error), rows in found.items()
        ]
        out.sort(key=lambda g: (-g.count, g.sink, g.error or ""))
        return out[: max(groups, 0)]


def _key(cursor: Cursor) -> tuple[float, str]:
    return (cursor.received_at, cursor.id)
