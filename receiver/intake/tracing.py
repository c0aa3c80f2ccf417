"""The webhook handler with tracing on: each request a SERVER span
(:mod:`receiver.observe.tracing`).

A subclass of :class:`~receiver.intake.endpoint.Intake`, used only when tracing is on, so the plain
handler stays as it is: intake with tracing off pays nothing, not even an import. The span
carries the HTTP semantic conventions and ``receiver.event.id``, ``receiver.event.name``,
``receiver.job.id`` and ``receiver.outcome``; the stored event keeps the span's context, which
its processing continues.
"""

from __future__ import annotations

from typing import Any, cast

from aiohttp import web
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from receiver.intake.endpoint import Intake
from receiver.observe.tracing import Tracing
from receiver.store.base import Store
from receiver.store.records import NewEvent


class _StampedStore:
    """What intake asks of the store, the event stamped with the request span's context and
    the span with the event (:meth:`Tracing.store_event`)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def add_event(self, event: NewEvent) -> bool:
        return await Tracing.store_event(self._store, event)


class TracedIntake(Intake):
    """:class:`Intake` with a SERVER span around each request."""

    def __init__(self, *, tracing: Tracing, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._tracing = tracing
        self._store = cast(Store, _StampedStore(self._store))
        self._route = self._settings.server.path

    async def handle(self, request: web.Request) -> web.Response:
        # The convention's required attributes and the client: every attribute costs each
        # webhook (checked when set, encoded when exported).
        attributes = {
            "http.request.method": request.method,
            "http.route": self._route,
            "url.path": request.path,
            "url.scheme": request.scheme,
            "client.address": self._client_address(request),
        }
        name = f"{request.method} {self._route}"
        with self._tracing.server_span(request.headers, attributes, name) as span:
            response = await super().handle(request)
            span.set_attribute("http.response.status_code", response.status)
            if response.status >= 500:
                span.set_attribute("error.type", str(response.status))
                span.set_status(Status(StatusCode.ERROR))
        return response

    def _reject(
        self, request: web.Request, outcome: str, message: str, **fields: Any
    ) -> web.Response:
        trace.get_current_span().set_attribute("receiver.outcome", outcome)
        return super()._reject(request, outcome, message, **fields)
