"""Workers: enrich each event once, then let every sink's lane deliver it at its own pace.

A :class:`Worker` runs, in one process:

- the *enrichment* loop: claims events that have no snapshot yet (up to ``worker.concurrency``
  at once), fetches the fresh job and assets once per event and stores them with it; a failure
  backs off on the event, and after ``worker.max_attempts`` every pending delivery of the event
  is dead with that error (``events redeliver`` recovers it);
- one :class:`~receiver.delivery.lanes.Lane` per sink, each claiming only what that sink may
  send now;
- the lease heartbeat, extending the leases of everything in flight.

Every claim is leased: a worker that dies loses its claims when the lease runs out and another
worker takes them over. ``stop()`` stops claiming, lets work in flight finish within the drain
time, then cancels the rest and releases its leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import structlog

from receiver.config.settings import Settings
from receiver.delivery.attempts import Attempt, Notes
from receiver.delivery.enrich import Enricher
from receiver.delivery.lanes import Finish, Lane, LaneContext, policy_for
from receiver.delivery.snapshots import Snapshots
from receiver.errors import DeliveryError, StoreError, TransientError, UnknownEvent
from receiver.logs import get_logger
from receiver.observe.metrics import Metrics
from receiver.retry import RetryPolicy
from receiver.sinks.base import Sink
from receiver.store.asset_ledger import ledger_entries
from receiver.store.base import Store
from receiver.store.lanes_model import DeliveryKey, LanePolicy, Leases, new_lease_owner
from receiver.store.records import EventRecord, Outcome
from receiver.supervisor import Supervisor

if TYPE_CHECKING:
    from receiver.observe.tracing import Tracing

log = get_logger("receiver.worker")

#: How often deliveries to sinks no longer configured are looked for.
RETIRE_INTERVAL_SECONDS = 300.0


class Worker:
    """The processing loops. ``start()`` them, ``wake()`` them on new events, ``stop()`` them."""

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
        tracing: Tracing | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self._sinks = {sink.name: sink for sink in sinks}
        self._enricher = enricher
        self._metrics = metrics
        self._clock = clock
        self.owner = owner or new_lease_owner()
        worker = settings.worker
        self._concurrency = worker.concurrency
        self._lease = worker.lease_seconds
        self._poll = worker.poll_interval_seconds
        self._enrich_policy = RetryPolicy.for_worker(worker)
        self._finish = Finish(metrics, clock)
        self._notes = Notes(clock=clock, tracing=tracing)
        context = LaneContext(
            store=store,
            snapshots=Snapshots(
                store=store, enricher=enricher, max_age=worker.job_max_age_seconds, clock=clock
            ),
            enricher=enricher,
            metrics=metrics,
            finish=self._finish,
            owner=self.owner,
            lease_seconds=self._lease,
            poll_seconds=self._poll,
            clock=clock,
            notes=self._notes,
        )
        self.lanes: dict[str, Lane] = {
            sink.name: Lane(
                sink=sink,
                policy=policy_for(
                    sink,
                    circuit_failures=worker.circuit_failures,
                    circuit_pause=worker.circuit_pause_seconds,
                    circuit_max=worker.backoff_max_seconds,
                ),
                concurrency=settings.sink_concurrency(sink.settings),
                retry=RetryPolicy.for_worker(worker, settings.sink_max_attempts(sink.settings)),
                context=context,
            )
            for sink in sinks
        }
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._enriching: dict[str, asyncio.Task[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._supervisor: Supervisor | None = None

    @property
    def running(self) -> bool:
        return bool(self._tasks) and not any(task.done() for task in self._tasks)

    def wake(self) -> None:
        """Look for work now instead of at the next poll (new events, a redelivery)."""
        self._wake.set()
        for lane in self.lanes.values():
            lane.wake()

    def start(self, supervisor: Supervisor | None = None) -> None:
        """Start enriching and every lane; lease extension runs under ``supervisor`` (restarted
        if it fails)."""
        self._tasks = [asyncio.create_task(self._run(), name="enrich-loop")]
        self._tasks += [
            asyncio.create_task(lane.run(self._stopping), name=f"lane-{name}")
            for name, lane in self.lanes.items()
        ]
        self._supervisor = supervisor or Supervisor()
        self._supervisor.start("leases", self._heartbeat)
        self._store.on_new_events(self.wake)

    def _in_flight(self) -> list[asyncio.Task[None]]:
        tasks = list(self._enriching.values())
        for lane in self.lanes.values():
            tasks.extend(lane.in_flight.values())
        return tasks

    async def stop(self, timeout: float) -> None:
        """Stop claiming, give work in flight ``timeout`` seconds, then cancel and release."""
        self._stopping.set()
        self.wake()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        pending = self._in_flight()
        if pending:
            _done, still = await asyncio.wait(pending, timeout=timeout)
            for task in still:
                task.cancel()
            if still:
                await asyncio.wait(still)
        if self._supervisor is not None:
            await self._supervisor.cancel("leases")

    # -- enrichment -----------------------------------------------------------------------------

    async def _run(self) -> None:
        failures = 0
        retired_at = -math.inf
        while not self._stopping.is_set():
            self._wake.clear()
            if time.monotonic() - retired_at >= RETIRE_INTERVAL_SECONDS:
                retired_at = time.monotonic()  # failed or not: enrichment goes on meanwhile
                try:
                    await self._retire_unknown_sinks()
                except StoreError as exc:
                    log.warning("sinks no longer configured not looked for", error=exc.message)
            try:
                claimed = await self._claim_enrichment()
                failures = 0
            except StoreError as exc:
                failures += 1
                delay = min(30.0, self._poll * 2**failures)
                log.warning("claim failed; retrying", error=exc.message, retry_in=round(delay, 1))
                await self._sleep(delay)
                continue
            if claimed and len(self._enriching) < self._concurrency:
                continue
            await self._sleep(self._poll)

    async def _retire_unknown_sinks(self) -> None:
        """Deliveries to a sink no longer configured are dead (redeliverable once it is back):
        no lane would ever take them, and their events would stay pending forever."""
        now = self._clock()
        for sink in sorted(await self._store.pending_sinks() - set(self._sinks)):
            lane = LanePolicy(sink)
            gone = Outcome("dead", error=f"sink {sink} is no longer configured")
            while claim := (
                await self._store.claim_deliveries(
                    lane, owner=self.owner, limit=100, lease_seconds=self._lease, now=now
                )
            ).deliveries:
                for held in claim:
                    with contextlib.suppress(UnknownEvent):  # pruned meanwhile
                        state = await self._store.settle(held.event.id, sink, gone, now=now)
                        self._metrics.sink_deliveries.labels(sink, "dead").inc()
                        self._finish(held.event, state)
                log.warning("deliveries to a sink no longer configured are dead", sink=sink)

    async def _sleep(self, seconds: float) -> None:
        """Wait for ``seconds``, a wake-up, or a free slot, whichever comes first."""
        woken = asyncio.ensure_future(self._wake.wait())
        waiters: set[asyncio.Future[Any]] = {woken}
        if len(self._enriching) >= self._concurrency:
            waiters.update(self._enriching.values())
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()

    async def _claim_enrichment(self) -> int:
        free = self._concurrency - len(self._enriching)
        if free <= 0 or self._stopping.is_set():
            return 0
        records = await self._store.claim_enrichment(
            owner=self.owner, limit=free, lease_seconds=self._lease, now=self._clock()
        )
        for record in records:
            task = asyncio.create_task(self._enrich(record), name=f"enrich-{record.id}")
            self._enriching[record.id] = task
            task.add_done_callback(functools.partial(self._enriched, record.id))
        return len(records)

    def _enriched(self, event_id: str, task: asyncio.Task[None]) -> None:
        self._enriching.pop(event_id, None)
        self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("event processing crashed", event_id=event_id, exc_info=task.exception())

    async def _enrich(self, record: EventRecord) -> None:
        structlog.contextvars.bind_contextvars(event_id=record.id, job_id=record.job_id)
        try:
            with self._notes.fetch(record) as note:
                await self._fetched(record, note)
        finally:
            structlog.contextvars.unbind_contextvars("event_id", "job_id")

    async def _fetched(self, record: EventRecord, note: Attempt) -> None:
        """Fetch the event's job and assets and store them (or the failure) with the event."""
        try:
            snapshot = await self._enricher.fetch(record)
        except asyncio.CancelledError:
            with contextlib.suppress(StoreError):
                await asyncio.shield(
                    self._store.release(Leases(events=(record.id,)), owner=self.owner)
                )
            raise
        except Exception as exc:
            await self._enrich_failed(record, exc, note)
            return
        job_type = self._enricher.build(record, snapshot).job_type
        finished = dict(self._finished(record, job_type))
        try:
            state = await self._store.save_snapshot(
                record.id,
                snapshot,
                finished=finished,
                ledger=ledger_entries(record.event, record.job_id, snapshot.job, snapshot.assets),
                now=self._clock(),
                steps=note.steps("fetched"),
            )
        except (StoreError, UnknownEvent) as exc:
            log.error("could not store the fetched job", error=str(exc))
            return
        for sink, outcome in finished.items():
            self._metrics.sink_deliveries.labels(
                sink, "skipped" if outcome.state == "skipped" else "dead"
            ).inc()
        self._finish(record, state)
        for d in record.deliveries:
            lane = self.lanes.get(d.sink)
            if lane is not None and d.state == "pending":
                lane.wake()

    def _finished(self, record: EventRecord, job_type: str | None) -> Iterable[tuple[str, Outcome]]:
        """Pending deliveries settled with the snapshot: sinks whose ``job_types`` filter the
        fresh job does not match (skipped), and sinks no longer configured (dead)."""
        for d in record.deliveries:
            if d.state != "pending":
                continue
            sink = self._sinks.get(d.sink)
            if sink is None:
                yield d.sink, Outcome("dead", error=f"sink {d.sink} is no longer configured")
            elif not sink.settings.wants_job_type(job_type):
                yield d.sink, Outcome("skipped", attempted=False)

    async def _enrich_failed(self, record: EventRecord, exc: Exception, note: Attempt) -> None:
        error: BaseException = exc
        if not isinstance(exc, DeliveryError):
            log.error("unexpected error while fetching the job", exc_info=exc)
            error = TransientError(f"unexpected error: {type(exc).__name__}: {exc}")
        attempts = record.enrich_attempts + 1
        decision = self._enrich_policy.decide(error, attempts)
        retry_at = None if decision.dead else self._clock() + decision.delay
        pending = [d.sink for d in record.deliveries if d.state == "pending"]
        try:
            state = await self._store.fail_enrichment(
                record.id,
                error=decision.reason,
                retry_at=retry_at,
                now=self._clock(),
                steps=note.steps("dead" if decision.dead else "retry", error),
            )
        except (StoreError, UnknownEvent) as exc2:
            log.error("could not record a failed fetch", error=str(exc2))
            return
        for sink in pending:
            self._metrics.sink_deliveries.labels(sink, "dead" if decision.dead else "retry").inc()
        if decision.dead:
            log.error(
                "event dead: the job could not be fetched", attempts=attempts, error=decision.reason
            )
            self._finish(record, state)
        else:
            log.warning(
                "fetching the job failed; will retry",
                attempt=attempts,
                retry_in=round(decision.delay, 2),
                error=decision.reason,
            )

    # -- leases ---------------------------------------------------------------------------------

    def _leases(self) -> Leases:
        deliveries: list[DeliveryKey] = []
        for lane in self.lanes.values():
            deliveries.extend(lane.in_flight)
        return Leases(events=tuple(self._enriching), deliveries=tuple(deliveries))

    async def _heartbeat(self) -> None:
        """Extend the leases of work still in progress, well before they run out."""
        while True:
            await asyncio.sleep(self._lease / 3)
            leases = self._leases()
            if not leases:
                continue
            try:
                await self._store.extend_leases(
                    leases, owner=self.owner, lease_seconds=self._lease, now=self._clock()
                )
            except StoreError as exc:
                log.warning("lease extension failed", error=str(exc))
