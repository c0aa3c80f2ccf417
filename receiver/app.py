"""Wiring: the resources of one receiver process and the two apps its listeners serve.

:class:`Runtime` opens everything a process needs (HTTP session, store, sinks, worker,
housekeeping) in order and closes it in reverse. Both listeners share it: the public app answers
only the webhook path and ``/healthz``; the ops app serves metrics, readiness and the admin API.
Listening, signals and graceful shutdown are :mod:`receiver.server`'s.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Literal

import aiohttp
from aiohttp import web

from receiver.config.settings import Settings
from receiver.delivery.enrich import Enricher
from receiver.delivery.redelivery import Redeliverer
from receiver.delivery.worker import Worker
from receiver.errors import StoreError
from receiver.intake.endpoint import Intake
from receiver.intake.protocol_errors import refusal_routes
from receiver.logs import get_logger
from receiver.observe.metrics import Metrics
from receiver.observe.space_gauges import InboxSpaceGauges
from receiver.ops.handlers import Ops
from receiver.ops.incident import IncidentAdmin
from receiver.ops.retention import Retention
from receiver.pull.admin import WatchAdmin
from receiver.pull.poller import Poller
from receiver.pull.reconcile import Reconciler, reconcile_periodically
from receiver.secrets import SecretBox
from receiver.sinks.base import Sink, SinkContext
from receiver.sinks.loader import build_sinks
from receiver.store import open_store
from receiver.store.base import Store
from receiver.store.lanes_model import LaneStats
from receiver.store.pull import WATCH_STATES
from receiver.store.records import EVENT_STATES
from receiver.store.retention_timing import Timing
from receiver.supervisor import Supervisor
from receiver.upstream.client import UpstreamClient
from receiver.upstream.drift import DriftReport
from receiver.upstream.spec_check import SpecCheck
from receiver.upstream.watchdog import Watchdog
from receiver.web import InboxUi

if TYPE_CHECKING:
    from receiver.observe.tracing import Tracing

log = get_logger("receiver.app")

Role = Literal["all", "intake", "worker"]
GAUGE_REFRESH_SECONDS = 5.0
# Refreshing the gauges counts the whole inbox (a million events: 0.1 s or more, longer under
# load): with a large inbox they are refreshed less often than every GAUGE_REFRESH_SECONDS, so
# that counting never takes more than this share of the time, however many events are stored.
GAUGE_REFRESH_SHARE = 0.02


def gauge_refresh_interval(took: float, took_before: float) -> float:
    """Seconds until the next refresh of the gauges, after two that took ``took_before`` then
    ``took`` seconds: stretched only when both were slow (a large inbox), not after one slow
    refresh alone (a receiver starting, a busy moment), which would leave the gauges stale for
    fifty times as long."""
    return max(GAUGE_REFRESH_SECONDS, min(took, took_before) * (1 / GAUGE_REFRESH_SHARE - 1))


class Runtime:
    """Every resource of one receiver process, opened with ``async with``.

    ``store`` and ``sinks`` may be passed in (tests); otherwise they come from the settings.
    ``check_store``: check the inbox file at open, and mend its indexes (the process that
    serves, see :func:`receiver.store.open_store`).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        role: Role = "all",
        store: Store | None = None,
        sinks: list[Sink] | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        tracing: Tracing | None = None,
        check_store: bool = False,
    ) -> None:
        self.settings = settings
        self.role = role
        self.metrics = metrics or Metrics()
        self.space_gauges = InboxSpaceGauges(self.metrics)
        self.clock = clock
        self.secrets = SecretBox(settings.webhook)
        self.store: Store = store or open_store(settings.store, check=check_store)
        self._given_sinks = sinks
        self.sinks: list[Sink] = []
        self.session: aiohttp.ClientSession | None = None
        #: The process's one upstream API client (set once the runtime is open).
        self.upstream: UpstreamClient | None = None
        self.worker: Worker | None = None
        self.poller: Poller | None = None
        self.watchdog: Watchdog | None = None
        #: The upstream's OpenAPI document compared now and then (see upstream_drift).
        self.spec_check: SpecCheck | None = None

        self.intake: Intake | None = None
        # The background loops: gauges, pruning, the watchdog and the worker's lease extension.
        self.supervisor = Supervisor(metrics=self.metrics)
        self._closed = False
        if tracing is None and settings.tracing.enabled:
            from receiver.observe.tracing import (
                Tracing,  # only now: tracing off imports nothing of it
            )

            tracing = Tracing(settings.tracing)
        #: OpenTelemetry (``[tracing]``), None when off.
        self.tracing = tracing
        if tracing is not None:
            tracing.start_logging()

    @property
    def runs_workers(self) -> bool:
        return self.role in ("all", "worker")

    async def __aenter__(self) -> Runtime:
        self.session = aiohttp.ClientSession()
        api = self.settings.api
        upstream = self.upstream = UpstreamClient(
            session=self.session,
            base_url=api.base_url,
            api_key=api.api_key,
            timeout=api.timeout_seconds,
            metrics=self.metrics,
            api_version=api.version,
        )
        try:
            await self.store.open()
            if self.runs_workers:
                await self._start_workers(self.session, upstream)
            self.supervisor.start("gauges", self._refresh_gauges)
            if self.runs_workers:
                timing = Timing.of(self.settings.store)
                retention = Retention(self.store, self.metrics, timing, clock=self.clock)
                self.supervisor.start("prune", retention.run)
            # --- upstream subscription watchdog ---
            self.watchdog = self._watchdog(upstream)
            if self.watchdog is not None:
                self.supervisor.start("watchdog", self.watchdog.run)
            # --- the upstream's OpenAPI document, compared in the background ---
            if SpecCheck.wanted(self.settings, self.runs_workers):
                self.spec_check = SpecCheck(
                    settings=self.settings, session=self.session, metrics=self.metrics
                )
                self.supervisor.start("spec-check", self.spec_check.run)
        except BaseException:
            await self.close()
            raise
        return self

    async def _start_workers(
        self, session: aiohttp.ClientSession, upstream: UpstreamClient
    ) -> None:
        context = SinkContext(settings=self.settings, session=session, metrics=self.metrics)
        self.sinks = self._given_sinks if self._given_sinks is not None else build_sinks(context)
        for sink in self.sinks:
            await sink.open()
        self.worker = Worker(
            settings=self.settings,
            store=self.store,
            sinks=self.sinks,
            enricher=Enricher(upstream, clock=self.clock),
            metrics=self.metrics,
            clock=self.clock,
            tracing=self.tracing,
        )
        self.worker.start(self.supervisor)
        self.poller = Poller(
            settings=self.settings,
            store=self.store,
            upstream=upstream,
            metrics=self.metrics,
            on_event=self.wake_worker,
            clock=self.clock,
            tracing=self.tracing,
        )
        self.poller.start()
        reconciler = Reconciler(
            settings=self.settings,
            store=self.store,
            upstream=upstream,
            metrics=self.metrics,
            on_event=self.wake_worker,
            clock=self.clock,
        )
        # Redelivery batches stored by any replica or command: queued here step by step.
        redeliverer = Redeliverer(
            store=self.store,
            metrics=self.metrics,
            on_queued=self.wake_worker,
            poll=self.settings.worker.poll_interval_seconds,
            intake_count=self.metrics.webhook_requests.labels("accepted").get,
            clock=self.clock,
        )
        self.supervisor.start("redeliveries", redeliverer.run)
        for config in self.settings.reconcile:
            self.supervisor.start(
                f"reconcile-{config.collection_id}",
                functools.partial(reconcile_periodically, reconciler, config),
            )

    @property
    def upstream_drift(self) -> DriftReport | None:
        """The latest look at the upstream's OpenAPI document (None before the first ends,
        or in a process that does not look)."""
        return self.spec_check.report if self.spec_check is not None else None

    def _watchdog(self, upstream: UpstreamClient) -> Watchdog | None:
        """The subscription watchdog, in processes that run workers and have an API key."""
        api = self.settings.api
        if not (self.runs_workers and api.api_key and api.watchdog_interval_seconds > 0):
            return None
        return Watchdog(
            upstream=upstream, metrics=self.metrics, interval=api.watchdog_interval_seconds
        )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Drain the worker, then close sinks, store and session, in that order (idempotent)."""
        if self._closed:
            return
        self._closed = True
        await self._stop_poller()
        if self.worker is not None:
            await self.worker.stop(self.settings.server.shutdown_timeout_seconds)
            self.worker = None
        await self.supervisor.stop()
        for sink in self.sinks:
            try:
                await sink.close()
            except Exception:
                log.exception("sink did not close cleanly", sink=sink.name)
        self.sinks = []
        await self.store.close()
        if self.session is not None:
            await self.session.close()
            self.session = None
        if self.tracing is not None:
            await self.tracing.shutdown(self.settings.server.shutdown_timeout_seconds)

    async def drain_workers(self, timeout: float) -> None:
        """Stop claiming; give in-flight events ``timeout`` seconds, then cancel and release."""
        await self._stop_poller()
        if self.worker is not None:
            await self.worker.stop(timeout)

    async def _stop_poller(self) -> None:
        if self.poller is not None:
            poller, self.poller = self.poller, None
            await poller.stop()

    def wake_worker(self) -> None:
        if self.worker is not None:
            self.worker.wake()

    def wake_poller(self) -> None:
        if self.poller is not None:
            self.poller.wake()

    def public_app(self) -> web.Application:
        """The public listener: ``POST {server.path}`` and ``GET /healthz``."""
        server = self.settings.server
        make: Callable[..., Intake] = Intake
        if self.tracing is not None:  # the plain handler stays untouched when tracing is off
            from receiver.intake.tracing import TracedIntake

            make = functools.partial(TracedIntake, tracing=self.tracing)
        intake = self.intake = make(
            settings=self.settings,
            store=self.store,
            secrets=self.secrets,
            metrics=self.metrics,
            on_stored=self.wake_worker,
            clock=self.clock,
        )
        app = web.Application(client_max_size=server.max_body_bytes)
        ops = self._ops()
        app.add_routes([web.post(server.path, intake.handle), web.get("/healthz", ops.healthz)])
        app.add_routes(refusal_routes({server.path: "POST", "/healthz": "GET, HEAD"}))
        return app

    def ops_app(self) -> web.Application:
        """The ops listener: metrics, health, readiness, the admin API and the inbox page."""
        app = web.Application()
        app.add_routes(self._ops().routes())
        app.router.add_get("/ui", _to_inbox_ui)  # before the sub-app, which would answer 404
        app.add_subapp("/ui/", self._inbox_ui().app())
        return app

    def _inbox_ui(self) -> InboxUi:
        return InboxUi(
            store=self.store,
            metrics=self.metrics,
            sinks=self.settings.sinks,
            admin_token=self.settings.admin.token,
            admin_host=self.settings.admin.host,
            upstream=self,
            on_redeliver=self.wake_worker,
            clock=self.clock,
            settings=self.settings,
        )

    def _ops(self) -> Ops:
        return Ops(
            store=self.store,
            metrics=self.metrics,
            admin_token=self.settings.admin.token,
            workers_running=(lambda: self.worker is not None and self.worker.running)
            if self.runs_workers
            else None,
            on_redeliver=self.wake_worker,
            settings=self.settings,
            tasks_down=self.supervisor.down,
            upstream_problems=lambda: self.upstream.pin.problems() if self.upstream else [],
            clock=self.clock,
            watch=WatchAdmin(
                store=self.store,
                settings=self.settings,
                on_watch=self.wake_poller,
                clock=self.clock,
            ),
            incident=IncidentAdmin(
                store=self.store,
                settings=self.settings,
                on_change=self.wake_worker,
                clock=self.clock,
            ),
        )

    async def refresh_gauges(self) -> None:
        """The gauges read from the store: the cheap ones first (pauses, watches), then those
        that count the inbox, which with a million pending may time out (the others are then
        fresh all the same)."""
        now = self.clock()
        lane_states = await self.store.lane_states()
        for sink in self.settings.sinks:
            lane_state = lane_states.get(sink.name)
            pause = lane_state.pause(now) if lane_state is not None else None
            self.metrics.sink_paused.labels(sink.name).set(1 if pause else 0)
            paused_for = max(0.0, now - pause.since) if pause else 0.0
            self.metrics.sink_paused_seconds.labels(sink.name).set(paused_for)
        watches = await self.store.watch_counts()
        for watch_state in WATCH_STATES:
            self.metrics.watched_jobs.labels(watch_state).set(watches.get(watch_state, 0))
        counts, oldest = await self.store.counts()
        for state in EVENT_STATES:
            self.metrics.inbox_events.labels(state).set(counts.get(state, 0))
        age = 0.0 if oldest is None else max(0.0, now - oldest)
        self.metrics.inbox_oldest_pending_seconds.set(age)
        space = await self.store.space()
        if space is not None:
            self.space_gauges.update(space)
        lanes = await self.store.lane_stats(now=now)
        for sink in self.settings.sinks:
            stats = lanes.get(sink.name, LaneStats())
            self.metrics.sink_backlog.labels(sink.name).set(stats.backlog)
            due = stats.oldest_due
            self.metrics.sink_oldest_due_seconds.labels(sink.name).set(
                0.0 if due is None else max(0.0, now - due)
            )

    async def _refresh_gauges(self) -> None:
        loop = asyncio.get_running_loop()
        took = 0.0
        while True:
            started = loop.time()
            try:
                await self.refresh_gauges()
            except StoreError as exc:
                log.warning("inbox gauges not refreshed", error=exc.message)
            took, took_before = loop.time() - started, took
            await asyncio.sleep(gauge_refresh_interval(took, took_before))


async def _to_inbox_ui(_request: web.Request) -> web.Response:
    return web.Response(status=308, headers={"Location": "/ui/"})
