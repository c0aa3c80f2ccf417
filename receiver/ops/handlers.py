"""The ops listener's handlers: health, readiness, metrics and the admin API (an incident's
half, redelivery batches and lane pauses, is :mod:`receiver.ops.incident`)."""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from receiver.config.settings import Settings
from receiver.delivery.redelivery import redeliver_event, start
from receiver.errors import StoreError, UnknownEvent
from receiver.intake.endpoint import error_response, page_window
from receiver.observe.metrics import CONTENT_TYPE, OPENMETRICS_TYPE, Metrics
from receiver.ops.incident import IncidentAdmin
from receiver.pull.admin import WatchAdmin
from receiver.store.base import Store
from receiver.store.batches import RedeliveryFilter
from receiver.store.records import EVENT_STATES

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Ops:
    """Handlers for ``/healthz``, ``/readyz``, ``/metrics`` and ``/admin/...``."""

    def __init__(
        self,
        *,
        store: Store,
        metrics: Metrics,
        admin_token: str,
        workers_running: Callable[[], bool] | None,
        on_redeliver: Callable[[], None] | None = None,
        settings: Settings | None = None,
        tasks_down: Callable[[], Mapping[str, str]] | None = None,
        clock: Callable[[], float] = time.time,
        watch: WatchAdmin | None = None,
        incident: IncidentAdmin | None = None,
        upstream_problems: Callable[[], list[str]] | None = None,
    ) -> None:
        self._settings = settings or Settings()
        self._store = store
        self._metrics = metrics
        self._token = admin_token
        self._workers_running = workers_running
        self._on_redeliver = on_redeliver or (lambda: None)
        self._tasks_down = tasks_down or dict
        self._clock = clock
        self._watch = watch
        self._incident = incident
        #: Why the upstream cannot be used as configured (a refused api.version), if it cannot.
        self._upstream_problems = upstream_problems or list

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/healthz", self.healthz),
            web.get("/readyz", self.readyz),
            web.get("/metrics", self.metrics),
            web.get("/admin/events", self._admin(self.list_events)),
            web.post("/admin/events/redeliver-dead", self._admin(self.redeliver_dead)),
            web.get("/admin/events/{id}", self._admin(self.show_event)),
            web.post("/admin/events/{id}/redeliver", self._admin(self.redeliver)),
            *(self._watch.routes(self._admin) if self._watch is not None else ()),
            *(self._incident.routes(self._admin) if self._incident is not None else ()),
        ]

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, _request: web.Request) -> web.Response:
        problems = []
        try:
            await self._store.ping()
        except StoreError as exc:
            problems.append(f"store: {exc.message}")
        if self._workers_running is not None and not self._workers_running():
            problems.append("workers: not running")
        for name, why in sorted(self._tasks_down().items()):
            problems.append(f"background task {name}: {why}")
        problems.extend(self._upstream_problems())
        if problems:
            return web.json_response({"status": "unavailable", "reasons": problems}, status=503)
        return web.json_response({"status": "ready"})

    async def metrics(self, request: web.Request) -> web.Response:
        # OpenMetrics when the scraper asks for it (Prometheus does): it carries exemplars.
        if "application/openmetrics-text" in request.headers.get("Accept", ""):
            body = self._metrics.render(openmetrics=True)
            return web.Response(body=body, headers={"Content-Type": OPENMETRICS_TYPE})
        return web.Response(body=self._metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    def _admin(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            if self._token:
                given = request.headers.get("Authorization", "")
                expected = f"Bearer {self._token}"
                if not hmac.compare_digest(given.encode(), expected.encode()):
                    return error_response(401, "unauthorized", "a valid Bearer token is required")
            try:
                return await handler(request)
            except StoreError as exc:
                return error_response(503, "unavailable", exc.message)

        return guarded

    async def list_events(self, request: web.Request) -> web.Response:
        state = request.query.get("status") or request.query.get("state")
        if state is not None and state not in EVENT_STATES:
            return error_response(
                400, "invalid_request", f"status must be one of {', '.join(EVENT_STATES)}"
            )
        window = page_window(request, 50)
        if isinstance(window, web.Response):
            return window
        limit, offset = window
        events = await self._store.list(state=state, limit=limit, offset=offset)
        data: list[dict[str, Any]] = [e.as_json(with_body=False) for e in events]
        return web.json_response({"data": data})

    async def show_event(self, request: web.Request) -> web.Response:
        event = await self._store.get(request.match_info["id"])
        if event is None:
            return error_response(404, "not_found", "no event with that id")
        data = event.as_json()
        # The event's timeline: its upstream calls and every attempt of every delivery.
        data["steps"] = [step.as_json() for step in await self._store.event_steps(event.id)]
        return web.json_response({"data": data})

    async def redeliver(self, request: web.Request) -> web.Response:
        """Every sink of the event again: a batch of one event (receiver.delivery.redelivery)."""
        try:
            batch = await redeliver_event(
                self._store,
                request.match_info["id"],
                sink=None,
                created_by=f"admin API ({request.remote or 'unknown'})",
                now=self._clock(),
            )
        except UnknownEvent:
            return error_response(404, "not_found", "no event with that id")
        self._on_redeliver()
        return web.json_response({"data": {"redelivered": batch.queued, "batch": batch.id}})

    async def redeliver_dead(self, request: web.Request) -> web.Response:
        """Every dead delivery again: a batch (the running receiver queues what its first step
        did not)."""
        batch = await start(
            self._store,
            RedeliveryFilter(status="dead"),
            created_by=f"admin API ({request.remote or 'unknown'})",
            now=self._clock(),
        )
        self._on_redeliver()
        return web.json_response(
            {"data": {"redelivered": batch.queued, "matched": batch.matched, "batch": batch.id}}
        )
