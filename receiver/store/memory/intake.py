"""The memory store's intake: a new event and its deliveries, refused alike by every store's
rules (:func:`~receiver.store.rules.refuse_unstorable`, the job-outcome rule)."""

from __future__ import annotations

from receiver.store import rules
from receiver.store.memory.pull import MemoryPull
from receiver.store.memory.records import MemoryDelivery, MemoryEvent
from receiver.store.records import NewEvent


class MemoryIntake(MemoryPull):
    """:meth:`add_event` of :class:`~receiver.store.memory.store.MemoryStore`."""

    async def add_event(self, event: NewEvent) -> bool:
        self._check()
        rules.refuse_unstorable((event.id, event.event, event.job_id))
        if event.id in self._events or not self._admit(event):
            return False
        sinks = tuple(dict.fromkeys(event.sinks))
        state, enrich_at = rules.new_event_values(bool(sinks), event.received_at)
        ev = MemoryEvent(
            seq=next(self._seq),
            new=event,
            state=state,
            enrich_at=enrich_at,
            stored_at=event.received_at,  # in memory the moment it is received
        )
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
