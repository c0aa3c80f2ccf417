"""The memory store's redelivery batches and lane pauses (the rules of
:mod:`receiver.store.batches` and :mod:`receiver.store.rules`, on the rows of :mod:`.records`;
a cancel withdraws as :mod:`receiver.store.sql.withdraw` describes)."""

from __future__ import annotations

from dataclasses import replace

from receiver.store import batches as model
from receiver.store import rules
from receiver.store.batches import (
    MatchedDelivery,
    Progress,
    RedeliveryBatch,
    RedeliveryFilter,
    RedeliveryPreview,
    UnknownBatch,
)
from receiver.store.lanes_model import LanePause, LanePolicy, LaneState
from receiver.store.memory.records import (
    BeforeBatch,
    Enrichment,
    MemoryDelivery,
    MemoryEvent,
    MemoryTables,
    reset_deliveries,
)


class MemoryBatches(MemoryTables):
    """Redelivery batches and lane pauses of the memory store."""

    def __init__(self) -> None:
        super().__init__()
        self._batches: dict[str, RedeliveryBatch] = {}
        #: The batch that last queued each delivery, by (event id, sink).
        self._batch_of: dict[tuple[str, str], str] = {}

    def _matching(self, flt: RedeliveryFilter, ev: MemoryEvent, now: float) -> list[MemoryDelivery]:
        e = ev.new
        if not model.event_matches(
            flt, event_id=e.id, event=e.event, job_id=e.job_id, received_at=e.received_at
        ):
            return []
        return [
            d
            for _sink, d in sorted(ev.deliveries.items())
            if model.delivery_matches(
                flt,
                state=d.state,
                sink=d.sink,
                last_error=d.last_error,
                leased=not rules.lease_free(d.lease_expires_at, now),
            )
        ]

    async def preview_redelivery(
        self, flt: RedeliveryFilter, *, now: float, sample: int = 5
    ) -> RedeliveryPreview:
        self._check()
        matched = 0
        found: list[MatchedDelivery] = []
        for event_id in sorted(self._events):
            ev = self._events[event_id]
            for d in self._matching(flt, ev, now):
                matched += 1
                if len(found) < sample:
                    found.append(
                        MatchedDelivery(ev.delivery_record(d), ev.new.event, ev.new.received_at)
                    )
        return RedeliveryPreview(matched, tuple(found))

    async def create_redelivery(
        self, flt: RedeliveryFilter, *, batch_id: str, created_by: str, now: float
    ) -> RedeliveryBatch:
        matched = (await self.preview_redelivery(flt, now=now, sample=0)).matched
        batch = RedeliveryBatch(batch_id, flt, created_by, now, "running", matched)
        self._batches[batch_id] = batch
        return batch

    async def step_redelivery(self, batch_id: str, *, limit: int, now: float) -> int | None:
        self._check()
        batch = self._batches.get(batch_id)
        if batch is None or not batch.queuing:
            return None
        flt, after, limit = batch.filter, batch.cursor or "", max(limit, 1)
        ids = sorted(
            event_id
            for event_id, ev in self._events.items()
            if event_id > after and self._next(flt, ev)
        )[:limit]
        count = 0
        for event_id in ids:
            ev = self._events[event_id]
            chosen = self._matching(flt, ev, now)
            if chosen:
                for d in chosen:
                    d.before_batch = self._before(batch_id, ev, d)
                count += reset_deliveries(ev, chosen, now)
                for d in chosen:
                    self._batch_of[(event_id, d.sink)] = batch_id
        last = len(ids) < limit
        cursor = ids[-1] if ids else None
        self._batches[batch_id] = model.after_step(
            batch, cursor=cursor, queued=count, last=last, now=now
        )
        return count

    def _before(self, batch_id: str, ev: MemoryEvent, d: MemoryDelivery) -> BeforeBatch:
        """What ``d`` is now, kept as the batch ``batch_id`` queues it."""
        owner = self._batch_of.get((ev.new.id, d.sink))
        enrichment = None
        if ev.snapshot is None:
            enrichment = Enrichment(ev.enrich_at, ev.enrich_attempts, ev.enrich_error)
        return BeforeBatch(
            batch=batch_id,
            state=d.state,
            attempts=d.attempts,
            next_attempt_at=d.next_attempt_at,
            last_error=d.last_error,
            updated_at=d.updated_at,
            batch_id=owner,
            before=d.before_batch if d.state == "pending" and owner is not None else None,
            event=enrichment,
        )

    def _withdraw(self, batch_id: str, now: float) -> int:
        """Put back every delivery of the batch still pending and not leased at ``now`` as it
        was before the batch; how many (added to its ``withdrawn``)."""
        kept: dict[str, Enrichment] = {}
        count = 0
        for (event_id, sink), owner in sorted(self._batch_of.items()):
            ev = self._events.get(event_id)
            d = ev.deliveries.get(sink) if ev is not None and owner == batch_id else None
            b = d.before_batch if d is not None else None
            if ev is None or d is None or b is None or b.batch != batch_id:
                continue
            if d.state != "pending" or not rules.lease_free(d.lease_expires_at, now):
                continue
            d.state, d.attempts, d.next_attempt_at = b.state, b.attempts, b.next_attempt_at
            d.last_error, d.updated_at, d.before_batch = b.last_error, b.updated_at, b.before
            if b.batch_id is None:
                del self._batch_of[(event_id, sink)]
            else:
                self._batch_of[(event_id, sink)] = b.batch_id
            if b.event is not None and ev.snapshot is None:
                kept[event_id] = b.event
            ev.recompute()
            count += 1
        for event_id, enrichment in kept.items():
            ev = self._events[event_id]
            idle = rules.lease_free(ev.lease_expires_at, now)
            if idle and all(d.state != "pending" for d in ev.deliveries.values()):
                ev.enrich_at = enrichment.enrich_at
                ev.enrich_attempts = enrichment.enrich_attempts
                ev.enrich_error = enrichment.enrich_error
        if count:
            batch = self._batches[batch_id]
            self._batches[batch_id] = replace(batch, withdrawn=batch.withdrawn + count)
        return count

    @staticmethod
    def _next(flt: RedeliveryFilter, ev: MemoryEvent) -> bool:
        """Whether a step looks at ``ev`` at all (as the SQL's NEXT_* statements)."""
        if flt.event_id is not None:
            return ev.new.id == flt.event_id
        if flt.job_id is not None:
            return ev.new.job_id == flt.job_id
        if flt.status == "dead":
            return any(d.state == "dead" for d in ev.deliveries.values())
        return True

    def _progress(self, batch_id: str) -> Progress:
        rows: dict[str, int] = {}
        for (event_id, sink), owner in self._batch_of.items():
            ev = self._events.get(event_id)
            d = ev.deliveries.get(sink) if ev is not None else None
            if owner == batch_id and d is not None:
                rows[d.state] = rows.get(d.state, 0) + 1
        return model.progress_of(rows.items())

    def _shown(self, batch: RedeliveryBatch) -> RedeliveryBatch:
        if batch.finished_at is not None:
            return batch
        return replace(batch, progress=self._progress(batch.id))

    async def finish_redeliveries(self, *, now: float) -> list[str]:
        self._check()
        done = []
        for batch in list(self._batches.values()):
            if batch.finished_at is not None or batch.queuing:
                continue
            if batch.state == "cancelled":
                self._withdraw(batch.id, now)
                batch = self._batches[batch.id]
            progress = self._progress(batch.id)
            if progress.pending == 0:
                self._batches[batch.id] = model.finished(batch, progress, now)
                done.append(batch.id)
        return done

    async def queuing_redeliveries(self) -> list[str]:
        self._check()
        return [b.id for b in self._batches.values() if b.queuing]

    async def redelivery(self, batch_id: str) -> RedeliveryBatch | None:
        self._check()
        batch = self._batches.get(batch_id)
        return self._shown(batch) if batch is not None else None

    async def redeliveries(self, *, limit: int = 50) -> list[RedeliveryBatch]:
        self._check()
        newest = sorted(self._batches.values(), key=lambda b: (b.created_at, b.id), reverse=True)
        return [self._shown(b) for b in newest[: max(limit, 0)]]

    async def cancel_redelivery(self, batch_id: str, *, now: float) -> RedeliveryBatch:
        self._check()
        batch = self._batches.get(batch_id)
        if batch is None:
            raise UnknownBatch(batch_id)
        if batch.finished_at is not None:
            return self._shown(batch)
        if batch.state == "running":
            self._batches[batch_id] = replace(batch, state="cancelled", cancelled_at=now)
        self._withdraw(batch_id, now)
        return self._shown(self._batches[batch_id])

    # -- lane pauses ----------------------------------------------------------------------------

    def _lane(self, sink: str, now: float) -> LaneState:
        return self._lanes.get(sink) or rules.fresh_lane(LanePolicy(sink=sink), now)

    async def pause_lane(
        self, sink: str, *, until: float | None, reason: str | None, now: float
    ) -> LanePause:
        self._check()
        state = self._lane(sink, now)
        held = state.pause(now)
        pause = LanePause(held.since if held is not None else now, until, reason)
        self._lanes[sink] = replace(
            state, hold_since=pause.since, hold_until=until, hold_reason=reason
        )
        return pause

    async def resume_lane(self, sink: str, *, now: float) -> LanePause | None:
        self._check()
        state = self._lane(sink, now)
        self._lanes[sink] = replace(state, hold_since=None, hold_until=None, hold_reason=None)
        return state.pause(now)

    async def lane_states(self) -> dict[str, LaneState]:
        self._check()
        return dict(sorted(self._lanes.items()))
