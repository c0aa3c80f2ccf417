"""Sending deliveries again: every redelivery is a batch (:mod:`receiver.store.batches`).

One code path for all of them: ``receiver redeliver`` and ``POST /admin/redeliveries`` (a
filter, maybe a million deliveries), the inbox page's buttons (one delivery, an event, a
dead-letter group, every dead letter) and ``events redeliver``. :func:`start` stores the batch
and queues its first step at once (a small batch is then queued already); the
:class:`Redeliverer` of every running receiver (any replica) queues the rest, step by step, and
marks batches done once none of their deliveries is pending. The lanes send what was queued at
their own pace and rate. A cancel (``Store.cancel_redelivery``) withdraws at once what no lane
has started to send; closing a cancelled batch withdraws what a send in flight then left
waiting for a retry.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from receiver.config.schema import did_you_mean
from receiver.errors import StoreError, UnknownEvent
from receiver.humantime import iso_utc, parse_when
from receiver.logs import get_logger
from receiver.observe.metrics import Metrics
from receiver.store.base import Store
from receiver.store.batches import STEP_EVENTS, RedeliveryBatch, RedeliveryFilter, filter_from

log = get_logger("receiver.redelivery")

#: How often a receiver looks for batches to queue or finish when none is queuing.
POLL_SECONDS = 1.0
#: The share of the time queuing may keep the store's writer busy while this process takes
#: webhooks: after a step that took ``t`` seconds the next waits ``t * (1 / share - 1)``, so
#: intake keeps the rest. While no webhook arrived since the last step, ``IDLE_SHARE``.
QUEUE_SHARE = 0.15
IDLE_SHARE = 0.6


def new_batch_id() -> str:
    """A batch id: 16 hex digits, short enough to type."""
    return uuid.uuid4().hex[:16]


def when(now: float) -> Callable[[str, Any], float]:
    """How a filter's ``since``/``until`` is read: a unix time (a number), an ISO 8601 time
    (UTC when it names no offset) or a duration back from ``now`` (``90s``, ``2h``, ``3d``)."""

    def read(field: str, value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError("must be a time")
        if isinstance(value, int | float):
            return float(value)
        if not isinstance(value, str):
            raise ValueError("must be a time: 2026-11-23T09:00 or a duration back (2h)")
        return parse_when(value, now, what="")

    return read


def filter_text(flt: RedeliveryFilter) -> str:
    """A batch's filter in one line: ``status=dead sinks=chat since=2026-11-23T09:00:00Z``."""
    parts = []
    for name, value in flt.as_json().items():
        if value is None or value == []:
            continue
        if name in ("since", "until"):
            value = iso_utc(value)
        elif isinstance(value, list):
            value = ",".join(value)
        parts.append(f"{name}={value}")
    return " ".join(parts)


def read_filter(data: Mapping[str, Any], *, sinks: Iterable[str], now: float) -> RedeliveryFilter:
    """A filter from the admin API's JSON, the page's form or the command line; BadFilter
    names the wrong field."""
    return filter_from(data, sinks=sinks, when=when(now))


async def start(
    store: Store,
    flt: RedeliveryFilter,
    *,
    created_by: str,
    now: float,
    step: int = STEP_EVENTS,
) -> RedeliveryBatch:
    """Store a batch for ``flt`` and queue its first step now; the batch as it then stands."""
    batch = await store.create_redelivery(
        flt, batch_id=new_batch_id(), created_by=created_by, now=now
    )
    await store.step_redelivery(batch.id, limit=step, now=now)
    log.info(
        "redelivery batch started",
        batch=batch.id,
        matched=batch.matched,
        created_by=created_by,
        filter=flt.as_json(),
    )
    return await store.redelivery(batch.id) or batch


async def redeliver_event(
    store: Store, event_id: str, *, sink: str | None, created_by: str, now: float
) -> RedeliveryBatch:
    """Send one event again (every sink but skipped ones, or only ``sink``): a batch of one
    event. UnknownEvent for an unknown event or a sink it has no delivery for."""
    record = await store.get(event_id)
    if record is None:
        raise UnknownEvent(f"no event {event_id} in the inbox")
    sinks = [d.sink for d in record.deliveries]
    if sink is not None and sink not in sinks:
        raise UnknownEvent(
            f"event {event_id} has no delivery to sink {sink!r}"
            f"{did_you_mean(sink, sinks)}; its sinks: {', '.join(sinks) or 'none'}"
        )
    flt = RedeliveryFilter(status="any", event_id=event_id, sinks=(sink,) if sink else ())
    return await start(store, flt, created_by=created_by, now=now)


class Redeliverer:
    """Queues the running batches step by step and finishes them, in a running receiver.

    ``on_queued`` wakes the lanes after a step queued something. Each step is one short
    transaction; between steps it waits so that queuing keeps the store busy for at most
    ``share`` of the time. Any replica may step any batch: a step takes the batch's cursor in
    its own transaction, so each delivery is queued once.
    """

    def __init__(
        self,
        *,
        store: Store,
        metrics: Metrics,
        on_queued: Callable[[], None],
        step: int = STEP_EVENTS,
        poll: float = POLL_SECONDS,
        share: float = QUEUE_SHARE,
        idle_share: float = IDLE_SHARE,
        intake_count: Callable[[], float] = lambda: 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._on_queued = on_queued
        self._step = step
        self._poll = poll
        self._share = min(1.0, max(0.01, share))
        self._idle_share = min(1.0, max(self._share, idle_share))
        self._intake_count = intake_count
        self._intake_seen = intake_count()
        self._clock = clock

    async def run(self) -> None:
        """Forever (a supervised background task); a store outage is logged and waited out."""
        while True:
            try:
                busy = await self.tick()
            except StoreError as exc:
                log.warning("redelivery batches not stepped", error=exc.message)
                busy = False
            if not busy:
                await asyncio.sleep(self._poll)

    async def tick(self) -> bool:
        """One step of every queuing batch, then finish those with nothing pending (a cancelled
        one after withdrawing what waits for a retry); whether any batch is still queuing."""
        queuing = await self._store.queuing_redeliveries()
        for batch_id in queuing:
            started = time.monotonic()
            count = await self._store.step_redelivery(batch_id, limit=self._step, now=self._clock())
            if count:
                self._metrics.redelivery_queued.inc(count)
                self._on_queued()
            took = time.monotonic() - started
            await asyncio.sleep(took * (1 / self._current_share() - 1))
        for batch_id in await self._store.finish_redeliveries(now=self._clock()):
            batch = await self._store.redelivery(batch_id)
            if batch is not None:
                p = batch.progress
                log.info(
                    "redelivery batch finished",
                    batch=batch_id,
                    state=batch.state,
                    queued=batch.queued,
                    delivered=p.delivered,
                    failed=p.failed,
                    withdrawn=batch.withdrawn,
                )
        return bool(queuing)

    def _current_share(self) -> float:
        """``share`` while webhooks arrive (``intake_count``, this process's accepted webhooks,
        moved since the last look), else ``idle_share``."""
        seen, self._intake_seen = self._intake_seen, self._intake_count()
        return self._share if self._intake_seen != seen else self._idle_share
