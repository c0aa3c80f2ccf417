"""Follows watched jobs with the upstream's long-poll until they finish.

The :class:`Poller` claims ``watching`` rows of the watch list (leased, so replicas never poll
one job at the same time) and asks ``GET /jobs/{id}?wait=true&timeout=<pull.wait_seconds>`` for
each, at most ``pull.concurrency`` at once. The upstream answers when the job finishes or at the
timeout:

- ``completed`` / ``failed``: the matching ``job.completed`` / ``job.failed`` event goes into
  the inbox through ``store.add_event``, exactly as a webhook would (same dedup, same sinks);
  the watch ends ``done``;
- still running: the job is polled again at once (the long-poll itself is the wait);
- 404: the watch ends ``not_found``;
- 429, 5xx, timeouts, 401/403: polled again after the worker's backoff, or the upstream's
  ``Retry-After`` when longer.

Watches not finished within ``pull.watch_expiry_hours`` end ``expired``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from receiver.config.settings import Settings
from receiver.errors import DeliveryError, PermanentError, StoreError
from receiver.logs import get_logger
from receiver.observe.metrics import Metrics
from receiver.observe.timeline import Call, recording
from receiver.pull.events import OUTCOME_BY_STATUS, outcome_event
from receiver.retry import RetryPolicy
from receiver.store.base import Store
from receiver.store.lanes_model import new_lease_owner
from receiver.store.pull import WatchRecord, WatchState

if TYPE_CHECKING:
    from receiver.observe.tracing import Tracing

log = get_logger("receiver.pull.poller")

#: A long-poll that answers "still running" sooner than this is not repeated before it.
MIN_POLL_INTERVAL_SECONDS = 1.0
#: A lease outlives the long-poll (plus the request timeout) by this much.
LEASE_MARGIN_SECONDS = 30.0
#: Expired watches are looked for at most this often.
EXPIRE_EVERY_SECONDS = 5.0


class JobPoller(Protocol):
    """What the poller needs from the upstream client."""

    async def get_job(
        self, job_id: str, *, wait_seconds: float | None = None
    ) -> dict[str, Any]: ...


class Poller:
    """The long-poll loop over the watch list. ``start()``, ``wake()``, ``stop()``."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        upstream: JobPoller,
        metrics: Metrics,
        on_event: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
        owner: str | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._settings = settings
        self._tracing = tracing
        self._store = store
        self._upstream = upstream
        self._metrics = metrics
        self._on_event = on_event
        self._clock = clock
        self.owner = owner or new_lease_owner()
        pull, worker = settings.pull, settings.worker
        self._concurrency = pull.concurrency
        self._wait = pull.wait_seconds
        self._lease = pull.wait_seconds + settings.api.timeout_seconds + LEASE_MARGIN_SECONDS
        self._idle = worker.poll_interval_seconds
        # Never dead: a watch ends by its expiry, not by a number of failed polls.
        self._policy = RetryPolicy.for_worker(worker, max_attempts=2**31)
        self._failures: dict[str, int] = {}
        self._active: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._expired_at = 0.0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="pull-poller")

    def wake(self) -> None:
        """Look at the watch list now (a job was just watched)."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop claiming; end the long-polls in flight and hand their jobs back."""
        self._stopping.set()
        self._wake.set()
        if self._task is not None:
            await self._task
        polls = list(self._active.values())
        for task in polls:
            task.cancel()
        if polls:
            await asyncio.wait(polls)

    async def run_once(self) -> int:
        """Expire what is due, claim what may be polled now and start polling it."""
        now = self._clock()
        if now - self._expired_at >= EXPIRE_EVERY_SECONDS:
            self._expired_at = now
            expired = await self._store.expire_watches(now=now)
            if expired:
                log.warning("watched jobs expired without finishing", count=expired)
        free = self._concurrency - len(self._active)
        if free <= 0 or self._stopping.is_set():
            return 0
        claimed = await self._store.claim_watches(
            owner=self.owner, limit=free, lease_seconds=self._lease, now=now
        )
        for watch in claimed:
            task = asyncio.create_task(self._poll(watch), name=f"poll-{watch.job_id}")
            self._active[watch.job_id] = task
            task.add_done_callback(functools.partial(self._forget, watch.job_id))
        return len(claimed)

    def _forget(self, job_id: str, task: asyncio.Task[None]) -> None:
        self._active.pop(job_id, None)
        if not task.cancelled() and task.exception() is not None:
            # Nothing is lost (the lease runs out and the job is polled again), but say so.
            log.error("polling a watched job crashed", job_id=job_id, exc_info=task.exception())

    async def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                claimed = await self.run_once()
                failures = 0
            except StoreError as exc:
                failures += 1
                delay = min(30.0, self._idle * 2**failures)
                log.warning("watch list not read; retrying", error=exc.message, retry_in=delay)
                await self._sleep(delay)
                continue
            if not claimed:
                await self._sleep(self._idle)

    async def _sleep(self, seconds: float) -> None:
        """Wait for ``seconds``, a wake-up or a finished poll, whichever comes first."""
        self._wake.clear()
        woken = asyncio.ensure_future(self._wake.wait())
        waiters: set[asyncio.Future[Any]] = {woken, *self._active.values()}
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()

    async def _poll(self, watch: WatchRecord) -> None:
        job_id = watch.job_id
        started = self._clock()
        try:
            with recording() as calls:  # the poll that finds the outcome starts its trace
                job = await self._upstream.get_job(job_id, wait_seconds=self._wait)
        except asyncio.CancelledError:
            await self._settle(job_id, "watching")  # shutting down: another poller takes it
            raise
        except PermanentError as exc:
            if exc.status == 404:
                log.warning("watched job is unknown upstream", job_id=job_id)
                await self._settle(job_id, "not_found", error=exc.message)
                return
            await self._retry(job_id, exc)
            return
        except DeliveryError as exc:
            await self._retry(job_id, exc)
            return
        self._failures.pop(job_id, None)
        status = job.get("status")
        event = OUTCOME_BY_STATUS.get(str(status))
        if event is None:
            await self._settle(job_id, "watching", next_poll_at=started + MIN_POLL_INTERVAL_SECONDS)
            return
        await self._finish(job_id, event, job, calls)

    async def _finish(
        self, job_id: str, event: str, job: dict[str, Any], calls: Sequence[Call] = ()
    ) -> None:
        job_type = job.get("type")
        new = outcome_event(
            self._settings,
            source="poll",
            event=event,
            job_id=job_id,
            now=self._clock(),
            job_type=job_type if isinstance(job_type, str) else None,
        )
        try:
            if self._tracing is None:
                added = await self._store.add_event(new)
            else:
                added = await self._tracing.store_polled(self._store, new, calls)
        except StoreError as exc:
            # The lease runs out and the job is polled again; the event id is stable.
            log.error("event of a watched job not stored", job_id=job_id, error=exc.message)
            return
        if added:
            self._metrics.pull_events.labels("poll").inc()
            self._metrics.events.labels(event, "received").inc()
            self._on_event()
        log.info("watched job finished", job_id=job_id, event_name=event, new_event=added)
        await self._settle(job_id, "done")

    async def _retry(self, job_id: str, error: DeliveryError) -> None:
        failures = self._failures[job_id] = self._failures.get(job_id, 0) + 1
        decision = self._policy.decide(error, failures)
        log.warning(
            "watched job not polled; will retry",
            job_id=job_id,
            error=error.message,
            retry_in=round(decision.delay, 2),
        )
        await self._settle(
            job_id,
            "watching",
            next_poll_at=self._clock() + decision.delay,
            error=decision.reason,
        )

    async def _settle(
        self,
        job_id: str,
        state: WatchState,
        *,
        next_poll_at: float | None = None,
        error: str | None = None,
    ) -> None:
        if state != "watching":
            self._failures.pop(job_id, None)
        try:
            await asyncio.shield(
                self._store.settle_watch(
                    job_id,
                    owner=self.owner,
                    state=state,
                    now=self._clock(),
                    next_poll_at=next_poll_at,
                    error=error,
                )
            )
        except StoreError as exc:  # the lease runs out and the job is polled again
            log.error("watch not updated", job_id=job_id, state=state, error=exc.message)
