"""Workers: claim due events, enrich them, hand them to sinks, settle each delivery.

One :class:`Worker` runs a claim loop and processes up to ``worker.concurrency`` events at once;
each sink additionally has its own limit of deliveries in flight. Every delivery is settled on its
own as soon as its sink answers, so a slow or failing sink never holds the others back. A claim
is leased: the lease is extended while the event is being processed and released at the end; a
worker that dies loses its claims when the lease runs out and another worker takes them over.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

import structlog

from receiver import faults
from receiver.config import Settings
from receiver.enrich import Enricher
from receiver.errors import DeliveryError, StoreError, TransientError, UnknownEvent
from receiver.events import Enriched
from receiver.logs import get_logger
from receiver.metrics import Metrics
from receiver.retry import RetryPolicy
from receiver.sinks.base import Sink
from receiver.store.base import Claim, DeliveryRecord, Outcome, Store

log = get_logger("receiver.worker")


class Worker:
    """The processing loop. ``start()`` it, ``wake()`` it on new events, ``stop()`` it."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        sinks: list[Sink],
        enricher: Enricher,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        owner: str | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self._sinks = {sink.name: sink for sink in sinks}
        self._enricher = enricher
        self._metrics = metrics
        self._clock = clock
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        worker = settings.worker
        self._concurrency = worker.concurrency
        self._lease = worker.lease_seconds
        self._poll = worker.poll_interval_seconds
        self._policies = {
            sink.name: RetryPolicy(
                initial=worker.backoff_initial_seconds,
                maximum=worker.backoff_max_seconds,
                max_attempts=settings.sink_max_attempts(sink.settings),
            )
            for sink in sinks
        }
        self._sink_slots = {
            sink.name: asyncio.Semaphore(sink.settings.concurrency or worker.concurrency)
            for sink in sinks
        }
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._active: dict[str, asyncio.Task[None]] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done()

    def wake(self) -> None:
        """Look for work now instead of at the next poll."""
        self._wake.set()

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._run(), name="worker-loop")
        self._heartbeat_task = asyncio.create_task(self._heartbeat(), name="worker-leases")
        self._store.on_new_events(self.wake)

    async def stop(self, timeout: float) -> None:
        """Stop claiming, give in-flight events ``timeout`` seconds, then cancel and release."""
        self._stopping.set()
        self._wake.set()
        if self._loop_task:
            await self._loop_task
        pending = list(self._active.values())
        if pending:
            _done, still = await asyncio.wait(pending, timeout=timeout)
            for task in still:
                task.cancel()
            if still:
                await asyncio.wait(still)
        if self._heartbeat_task:
            self._heartbeat_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat_task

    async def run_until_idle(self, timeout: float = 30.0) -> None:
        """Process everything due now and wait for it (for tests and one-shot tools)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            claimed = await self._claim_batch()
            if not claimed and not self._active:
                return
            if self._active:
                await asyncio.wait(list(self._active.values()))
        raise TimeoutError("worker did not become idle in time")

    async def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                claimed = await self._claim_batch()
                failures = 0
            except StoreError as exc:
                failures += 1
                delay = min(30.0, self._poll * 2**failures)
                log.warning("claim failed; retrying", error=str(exc), retry_in=round(delay, 1))
                await self._sleep(delay)
                continue
            if claimed and len(self._active) < self._concurrency:
                continue
            await self._sleep(self._poll)

    async def _sleep(self, seconds: float) -> None:
        """Wait for ``seconds``, a wake-up, or a free slot, whichever comes first."""
        self._wake.clear()
        woken = asyncio.ensure_future(self._wake.wait())
        waiters: set[asyncio.Future[Any]] = {woken}
        if len(self._active) >= self._concurrency:
            waiters.update(self._active.values())
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()

    async def _claim_batch(self) -> int:
        free = self._concurrency - len(self._active)
        if free <= 0 or self._stopping.is_set():
            return 0
        claims = await self._store.claim(
            owner=self.owner, limit=free, lease_seconds=self._lease, now=self._clock()
        )
        for claim in claims:
            task = asyncio.create_task(self._process(claim), name=f"event-{claim.event.id}")
            self._active[claim.event.id] = task
            task.add_done_callback(functools.partial(self._forget, claim.event.id))
        return len(claims)

    def _forget(self, event_id: str, task: asyncio.Task[None]) -> None:
        self._active.pop(event_id, None)
        if not task.cancelled() and task.exception() is not None:
            # Nothing is lost (the lease runs out and the event is claimed again), but say so.
            log.error(
                "event processing crashed",
                event_id=event_id,
                exc_info=task.exception(),
            )

    async def _heartbeat(self) -> None:
        """Extend the leases of events still in progress, well before they run out."""
        while True:
            await asyncio.sleep(self._lease / 3)
            if not self._active:
                continue
            try:
                await self._store.extend_lease(
                    list(self._active),
                    owner=self.owner,
                    lease_seconds=self._lease,
                    now=self._clock(),
                )
            except StoreError as exc:
                log.warning("lease extension failed", error=str(exc))

    async def _process(self, claim: Claim) -> None:
        event = claim.event
        structlog.contextvars.bind_contextvars(event_id=event.id, job_id=event.job_id)
        try:
            try:
                enriched = await self._enricher.enrich(event)
            except Exception as exc:
                if not isinstance(exc, DeliveryError):
                    log.exception("unexpected error while fetching the job")
                    exc = TransientError(f"unexpected error: {type(exc).__name__}: {exc}")
                await asyncio.gather(*(self._fail(d, exc) for d in claim.due))
            else:
                await asyncio.gather(*(self._deliver(d, enriched) for d in claim.due))
            await self._record_finish(claim)
        finally:
            with contextlib.suppress(StoreError):
                await asyncio.shield(self._store.release([event.id], owner=self.owner))
            structlog.contextvars.unbind_contextvars("event_id", "job_id")

    async def _deliver(self, delivery: DeliveryRecord, enriched: Enriched) -> None:
        sink = self._sinks.get(delivery.sink)
        if sink is None:
            await self._settle(
                delivery,
                Outcome("dead", error=f"sink {delivery.sink} is no longer configured"),
                "dead",
            )
            return
        if not sink.settings.wants_job_type(enriched.job_type):
            await self._settle(delivery, Outcome("skipped", attempted=False), "skipped")
            return
        async with self._sink_slots[sink.name]:
            started = time.monotonic()
            try:
                async with asyncio.timeout(sink.settings.timeout_seconds):
                    await sink.send(enriched)
            except Exception as exc:
                if isinstance(exc, TimeoutError):
                    exc = TransientError(f"timed out after {sink.settings.timeout_seconds:g} s")
                elif not isinstance(exc, DeliveryError):
                    log.exception("unexpected sink error", sink=sink.name)
                    exc = TransientError(f"unexpected error: {type(exc).__name__}: {exc}")
                await self._fail(delivery, exc)
                return
            finally:
                self._metrics.sink_delivery_seconds.labels(sink.name).observe(
                    time.monotonic() - started
                )
        faults.reached("after_sink_success")
        await self._settle(delivery, Outcome("done"), "success")
        log.info("delivered", sink=sink.name, attempt=delivery.attempts + 1)

    async def _fail(self, delivery: DeliveryRecord, error: BaseException) -> None:
        policy = self._policies.get(delivery.sink)
        attempts = delivery.attempts + 1
        if policy is None:
            decision_dead, delay, reason = True, 0.0, str(error)
        else:
            decision = policy.decide(error, attempts)
            decision_dead, delay, reason = decision.dead, decision.delay, decision.reason
        if decision_dead:
            await self._settle(delivery, Outcome("dead", error=reason), "dead")
            log.error("delivery dead", sink=delivery.sink, attempts=attempts, error=reason)
        else:
            await self._settle(
                delivery,
                Outcome("pending", error=reason, next_attempt_at=self._clock() + delay),
                "retry",
            )
            log.warning(
                "delivery failed; will retry",
                sink=delivery.sink,
                attempt=attempts,
                retry_in=round(delay, 2),
                error=reason,
            )

    async def _settle(self, delivery: DeliveryRecord, outcome: Outcome, metric: str) -> None:
        self._metrics.sink_deliveries.labels(delivery.sink, metric).inc()
        try:
            await self._store.settle(delivery.event_id, delivery.sink, outcome, now=self._clock())
        except (StoreError, UnknownEvent) as exc:
            # The lease runs out and the delivery is attempted again: at-least-once.
            log.error("could not record a delivery result", sink=delivery.sink, error=str(exc))

    async def _record_finish(self, claim: Claim) -> None:
        """Count the event as processed (and its lag) once no delivery is left pending."""
        try:
            record = await self._store.get(claim.event.id)
        except StoreError:
            return
        if record is None or record.state == "pending":
            return
        self._metrics.events.labels(
            record.event, "processed" if record.state == "done" else "dead"
        ).inc()
        if record.state == "done":
            self._metrics.event_lag.observe(max(0.0, self._clock() - record.received_at))
            log.info("event processed", event_name=record.event)
