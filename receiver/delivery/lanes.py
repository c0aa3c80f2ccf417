"""Delivery lanes: every sink sends at its own pace, and a slow one holds back nothing else.

Each configured sink is a :class:`Lane` with its own ``concurrency`` (sends in flight in this
process) and its own ``rate_limit_per_second``. A lane asks the store only for what it may send
now (:meth:`~receiver.store.base.Store.claim_deliveries`: its free slots, the tokens of its
bucket, not while paused), in due-time order, so a delivery waiting for its lane holds nothing:
no slot, no lease, no connection. The bucket, the pause and the circuit breaker live in the store,
so they hold across every replica sharing it.

A send's result tells its lane (see :func:`lane_result`): a 429/503 with ``Retry-After`` pauses
the whole lane until then; consecutive failures open its circuit (the lane pauses, then sends one
probe). Deliveries reuse the event's stored snapshot while it is younger than
``worker.job_max_age_seconds`` and fetch it again otherwise
(:class:`~receiver.delivery.snapshots.Snapshots`); a download whose signed URL was refused fetches
those assets again and tries once more at once. Each attempt's steps go into the event's timeline
and,
with tracing on, its span (:mod:`receiver.delivery.attempts`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import structlog

from receiver import faults
from receiver.delivery.attempts import Attempt, Notes
from receiver.delivery.enrich import Enricher
from receiver.delivery.snapshots import Snapshots
from receiver.errors import (
    DeliveryError,
    NotReady,
    PermanentError,
    StoreError,
    TransientError,
    UnknownEvent,
    UrlRefused,
)
from receiver.events import Enriched
from receiver.logs import get_logger
from receiver.observe.metrics import Metrics
from receiver.observe.timeline import exemplar_of
from receiver.retry import RetryPolicy
from receiver.sinks.base import Sink
from receiver.store.base import Store
from receiver.store.lanes_model import (
    DeliveryKey,
    LanePolicy,
    LaneResult,
    LaneResultKind,
    Leased,
    Leases,
)
from receiver.store.records import EventRecord, EventState, Outcome
from receiver.store.steps import Step

log = get_logger("receiver.lanes")

#: Never sleep less than this between claims (a retry time just passed is not a busy loop).
MIN_WAIT_SECONDS = 0.005
#: A bucket holds this many seconds of its rate (at least one token): a small burst.
BURST_SECONDS = 0.1


def burst_for(rate: float) -> float:
    """The bucket size for ``rate``: one token, or a tenth of a second's worth if more."""
    return max(1.0, rate * BURST_SECONDS)


def lane_result(error: BaseException | None) -> tuple[LaneResultKind, float | None]:
    """What one attempt tells its lane, and for how long to pause the whole lane.

    A 429 or 503 carrying ``Retry-After`` pauses the lane (the destination asked every sender
    to slow down) and is not counted as a failure. A file not ready yet or a refusal of one
    event (permanent) says nothing about the destination's health; any other error counts
    toward the circuit breaker.
    """
    if error is None:
        return "success", None
    if isinstance(error, DeliveryError):
        if error.status in (429, 503) and error.retry_after is not None:
            return "neutral", error.retry_after
        if isinstance(error, (NotReady, PermanentError)):
            return "neutral", None
    return "failure", None


@dataclass
class Finish:
    """Called when a settle left an event no longer pending (its metrics are counted once)."""

    metrics: Metrics
    clock: Callable[[], float]

    def __call__(self, record: EventRecord, state: EventState) -> None:
        if state == "pending":
            return
        self.metrics.events.labels(record.event, "processed" if state == "done" else "dead").inc()
        if state == "done":
            lag = max(0.0, self.clock() - record.received_at)
            self.metrics.event_lag.observe(lag, exemplar_of(record.trace))
            log.info("event processed", event_id=record.id, event_name=record.event)


@dataclass(frozen=True)
class LaneContext:
    """What every lane of one worker shares."""

    store: Store
    snapshots: Snapshots
    enricher: Enricher
    metrics: Metrics
    finish: Finish
    owner: str
    lease_seconds: float
    poll_seconds: float
    clock: Callable[[], float] = time.time
    #: Each attempt's timeline steps and (tracing on) span; default: steps only.
    notes: Notes | None = None


class Lane:
    """One sink's lane in this process: claims what the lane may send, sends, settles."""

    def __init__(
        self,
        *,
        sink: Sink,
        policy: LanePolicy,
        concurrency: int,
        retry: RetryPolicy,
        context: LaneContext,
    ) -> None:
        self.sink = sink
        self.name = sink.name
        self.policy = policy
        self.concurrency = concurrency
        self._retry = retry
        self._store = context.store
        self._snapshots = context.snapshots
        self._enricher = context.enricher
        self._metrics = metrics = context.metrics
        self._finish = context.finish
        self._owner = context.owner
        self._lease = context.lease_seconds
        self._poll = context.poll_seconds
        self._clock = context.clock
        self._notes = context.notes or Notes(clock=context.clock)
        self._wake = asyncio.Event()
        self._held_until: float | None = None
        self.in_flight: dict[DeliveryKey, asyncio.Task[None]] = {}
        self._in_flight_gauge = metrics.sink_in_flight.labels(sink.name)
        self._in_flight_gauge.set(0)

    def wake(self) -> None:
        """Ask the store again now: there is new work (unless the lane's own pause or tokens
        allow nothing before a known time: then at that time)."""
        if self._held_until is None or self._held_until <= self._clock():
            self._wake.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """Claim and send until ``stopping`` is set; never raises for a store outage."""
        failures = 0
        while not stopping.is_set():
            self._wake.clear()
            try:
                claimed, retry_at = await self.claim()
                failures = 0
            except StoreError as exc:
                failures += 1
                delay = min(30.0, self._poll * 2**failures)
                log.warning("lane claim failed; retrying", sink=self.name, error=exc.message)
                await self._sleep(delay, stopping)
                continue
            if claimed and len(self.in_flight) < self.concurrency and retry_at is None:
                continue  # there may be more due right now
            wait = self._poll
            if retry_at is not None:
                wait = min(wait, max(MIN_WAIT_SECONDS, retry_at - self._clock()))
            await self._sleep(wait, stopping)

    async def _sleep(self, seconds: float, stopping: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                waiters = {asyncio.ensure_future(self._wake.wait())}
                waiters.add(asyncio.ensure_future(stopping.wait()))
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in waiters:
                        waiter.cancel()

    async def claim(self) -> tuple[int, float | None]:
        """Claim what the lane may send now and start sending it; (count, when to ask again)."""
        free = self.concurrency - len(self.in_flight)
        if free <= 0:
            return 0, None
        now = self._clock()
        claim = await self._store.claim_deliveries(
            self.policy, owner=self._owner, limit=free, lease_seconds=self._lease, now=now
        )
        self._held_until = claim.held_until
        for leased in claim.deliveries:
            key = DeliveryKey(leased.delivery.event_id, leased.delivery.sink)
            task = asyncio.create_task(self._deliver(leased, now), name=f"deliver-{key.sink}")
            self.in_flight[key] = task
            task.add_done_callback(functools.partial(self._done, key))
        self._in_flight_gauge.set(len(self.in_flight))
        return len(claim.deliveries), claim.retry_at

    def _done(self, key: DeliveryKey, task: asyncio.Task[None]) -> None:
        self.in_flight.pop(key, None)
        self._in_flight_gauge.set(len(self.in_flight))
        self._held_until = None  # a probe's result may have resumed the lane
        self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            # Nothing is lost (the lease runs out and it is claimed again), but say so.
            log.error(
                "delivery crashed", sink=self.name, event_id=key.event_id, exc_info=task.exception()
            )

    async def _deliver(self, leased: Leased, started: float) -> None:
        record, delivery = leased.event, leased.delivery
        attempt = delivery.attempts + 1
        with (
            _bound(event_id=record.id, job_id=record.job_id),
            self._notes.delivery(self.name, self.sink.settings.type, record, attempt) as note,
        ):
            try:
                error = await self._attempt(record, note)
            except asyncio.CancelledError:
                # Shutting down mid-send: hand the delivery back at once.
                with contextlib.suppress(StoreError):
                    await asyncio.shield(self._release(delivery.event_id))
                raise
            kind, pause = lane_result(error)
            lane = LaneResult(self.policy, kind, started, pause)
            if error is None:
                faults.reached("after_sink_success")
                log.info("delivered", sink=self.name, attempt=attempt)
                await self._settle(
                    record, Outcome("done"), "success", lane, note.steps("delivered")
                )
                return
            if pause is not None:
                log.warning("lane paused by the destination", sink=self.name, seconds=pause)
            decision = self._retry.decide(error, attempt)
            if decision.dead:
                dead = Outcome("dead", error=decision.reason)
                await self._settle(record, dead, "dead", lane, note.steps("dead", error))
                log.error("delivery dead", sink=self.name, attempts=attempt, error=decision.reason)
                return
            retry_at = self._clock() + decision.delay
            outcome = Outcome("pending", error=decision.reason, next_attempt_at=retry_at)
            await self._settle(record, outcome, "retry", lane, note.steps("retry", error))
            log.warning(
                "delivery failed; will retry",
                sink=self.name,
                attempt=attempt,
                retry_in=round(decision.delay, 2),
                error=decision.reason,
            )

    async def _attempt(self, record: EventRecord, note: Attempt) -> BaseException | None:
        """One attempt (with one more send at once after refused URLs were fetched again);
        the error it ended with, or None."""
        try:
            snapshot = await self._snapshots.current(record)
        except Exception as exc:
            return _delivery_error(exc, "unexpected error while fetching the job")
        error = await self._send(self._enricher.build(record, snapshot, note.traceparent), note)
        if isinstance(error, UrlRefused):
            try:
                snapshot = await self._snapshots.refused(record, snapshot, error.asset_ids)
            except Exception as exc:
                return _delivery_error(exc, "unexpected error while fetching the job")
            error = await self._send(self._enricher.build(record, snapshot, note.traceparent), note)
        return error

    async def _send(self, enriched: Enriched, note: Attempt) -> BaseException | None:
        timeout = self.sink.settings.timeout_seconds
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                note.status = await self.sink.send(enriched)
        except TimeoutError:
            return TransientError(f"timed out after {timeout:g} s")
        except Exception as exc:
            return _delivery_error(exc, "unexpected sink error")
        finally:
            self._metrics.sink_delivery_seconds.labels(self.name).observe(
                time.monotonic() - started, note.exemplar
            )
        return None

    async def _settle(
        self,
        record: EventRecord,
        outcome: Outcome,
        metric: str,
        lane: LaneResult,
        steps: Sequence[Step] = (),
    ) -> None:
        self._metrics.sink_deliveries.labels(self.name, metric).inc()
        try:
            state = await self._store.settle(
                record.id, self.name, outcome, now=self._clock(), lane=lane, steps=steps
            )
        except (StoreError, UnknownEvent) as exc:
            # The lease runs out and the delivery is attempted again: at-least-once.
            log.error("could not record a delivery result", sink=self.name, error=str(exc))
            return
        self._finish(record, state)

    async def _release(self, event_id: str) -> None:
        key = DeliveryKey(event_id, self.name)
        await self._store.release(Leases(deliveries=(key,)), owner=self._owner)


def _delivery_error(exc: BaseException, what: str) -> BaseException:
    """``exc`` as a DeliveryError: anything unexpected is logged (it is a bug) and retried."""
    if isinstance(exc, DeliveryError):
        return exc
    log.error(what, exc_info=exc)
    return TransientError(f"unexpected error: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def _bound(**values: str) -> Iterator[None]:
    structlog.contextvars.bind_contextvars(**values)
    try:
        yield
    finally:
        structlog.contextvars.unbind_contextvars(*values)


def policy_for(
    sink: Sink, *, circuit_failures: int, circuit_pause: float, circuit_max: float
) -> LanePolicy:
    """The lane policy of a configured sink."""
    rate = sink.settings.rate_limit_per_second
    if not math.isfinite(rate) or rate < 0:
        rate = 0.0
    return LanePolicy(
        sink=sink.name,
        rate=rate,
        burst=burst_for(rate),
        circuit_failures=circuit_failures,
        circuit_pause=circuit_pause,
        circuit_max=max(circuit_max, circuit_pause),
    )
