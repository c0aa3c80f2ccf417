"""The admin API for an incident: redelivery batches and lane pauses (behind the admin token).

- ``POST /admin/redeliveries`` with a filter ``{"status", "sinks", "event", "job_id", "since",
  "until", "dry_run"}``: 202 with the batch (``id``, ``matched``, ...), or for ``dry_run`` 200
  with ``matched`` and a ``sample``, changing nothing; ``GET /admin/redeliveries`` (newest
  first), ``GET /admin/redeliveries/{id}``, ``POST /admin/redeliveries/{id}/cancel``.
- ``GET /admin/lanes``; ``POST /admin/lanes/{name}/pause`` ``{"seconds"?, "reason"?}`` and
  ``POST /admin/lanes/{name}/resume``.

An unknown batch or lane is a 404, a bad filter or body a 400 whose message (and ``field``)
names the field, both with the contract's error body.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from receiver.config.settings import Settings
from receiver.delivery import pauses, redelivery
from receiver.errors import StoreError
from receiver.intake.endpoint import error_response, page_window
from receiver.store.base import Store
from receiver.store.batches import BadFilter, UnknownBatch
from receiver.store.lanes_model import LaneStats

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SAMPLE = 10


def bad_field(field: str, message: str) -> web.Response:
    """A 400 naming ``field``: the contract's error body, with ``field`` beside the message."""
    body = {"error": {"code": "invalid_request", "message": message, "field": field}}
    return web.json_response(body, status=400)


async def json_object(request: web.Request) -> dict[str, Any] | web.Response:
    """The request's JSON object body (an empty body is ``{}``), or the 400 answering it."""
    if not await request.read():
        return {}
    try:
        body = await request.json()
    except ValueError:
        return error_response(400, "invalid_request", "the body must be a JSON object")
    if not isinstance(body, dict):
        return error_response(400, "invalid_request", "the body must be a JSON object")
    return body


class IncidentAdmin:
    """Handlers of redelivery batches and lane pauses on the ops listener."""

    def __init__(
        self,
        *,
        store: Store,
        settings: Settings,
        on_change: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._settings = settings
        self._on_change = on_change
        self._clock = clock
        self._sinks = [s.name for s in settings.sinks]

    def routes(self, guard: Callable[[Handler], Handler]) -> list[web.RouteDef]:
        return [
            web.get("/admin/lanes", guard(self.lanes)),
            web.post("/admin/lanes/{name}/pause", guard(self.pause)),
            web.post("/admin/lanes/{name}/resume", guard(self.resume)),
            web.get("/admin/redeliveries", guard(self.list_batches)),
            web.post("/admin/redeliveries", guard(self.start)),
            web.get("/admin/redeliveries/{id}", guard(self.show_batch)),
            web.post("/admin/redeliveries/{id}/cancel", guard(self.cancel)),
        ]

    @staticmethod
    def _by(request: web.Request) -> str:
        return f"admin API ({request.remote or 'unknown'})"

    # -- lanes ----------------------------------------------------------------------------------

    async def lanes(self, _request: web.Request) -> web.Response:
        """Each configured sink's lane: limits, backlog across the store, pause and circuit."""
        views = await pauses.lane_views(self._store, self._settings, now=self._clock())
        return web.json_response({"data": [v.as_json() for v in views]})

    async def _lane(self, name: str) -> web.Response:
        """The lane after a pause or resume. That is written already: when its backlog cannot
        be counted in time (a million pending deliveries on a busy database), the answer says
        so (``counted: false``, the counts null) instead of failing as if nothing was done."""
        now = self._clock()
        try:
            views = await pauses.lane_views(self._store, self._settings, now=now)
        except StoreError:
            state = (await self._store.lane_states()).get(name)
            shown = pauses.lane_view(self._settings, name, LaneStats(), state, now).as_json()
            shown.update(backlog=None, oldest_due_seconds=None, in_flight=None, counted=False)
            return web.json_response({"data": shown})
        view = next(v for v in views if v.sink == name)
        return web.json_response({"data": {**view.as_json(), "counted": True}})

    async def pause(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await json_object(request)
        if isinstance(body, web.Response):
            return body
        unknown = sorted(set(body) - {"seconds", "reason"})
        if unknown:
            return bad_field(unknown[0], f"{unknown[0]}: not a field (seconds, reason)")
        try:
            seconds, reason = pauses.pause_terms(body.get("seconds"), body.get("reason"))
            await pauses.pause(
                self._store,
                self._settings,
                name,
                seconds=seconds,
                reason=reason,
                by=self._by(request),
                now=self._clock(),
            )
        except pauses.UnknownLane as exc:
            return error_response(404, "not_found", str(exc))
        except pauses.BadPause as exc:
            return bad_field(str(exc).split(":", 1)[0], str(exc))
        return await self._lane(name)

    async def resume(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            await pauses.resume(
                self._store, self._settings, name, by=self._by(request), now=self._clock()
            )
        except pauses.UnknownLane as exc:
            return error_response(404, "not_found", str(exc))
        self._on_change()
        return await self._lane(name)

    # -- redelivery batches ---------------------------------------------------------------------

    async def start(self, request: web.Request) -> web.Response:
        body = await json_object(request)
        if isinstance(body, web.Response):
            return body
        dry_run = body.pop("dry_run", False)
        if not isinstance(dry_run, bool):
            return bad_field("dry_run", "dry_run: must be true or false")
        now = self._clock()
        try:
            flt = redelivery.read_filter(body, sinks=self._sinks, now=now)
        except BadFilter as exc:
            return bad_field(exc.field, str(exc))
        if dry_run:
            preview = await self._store.preview_redelivery(flt, now=now, sample=SAMPLE)
            data = {
                "matched": preview.matched,
                "filter": flt.as_json(),
                "sample": [m.as_json() for m in preview.sample],
            }
            return web.json_response(data)
        batch = await redelivery.start(self._store, flt, created_by=self._by(request), now=now)
        self._on_change()
        return web.json_response(batch.as_json(), status=202)

    async def list_batches(self, request: web.Request) -> web.Response:
        window = page_window(request, 50)
        if isinstance(window, web.Response):
            return window
        limit, _offset = window
        batches = await self._store.redeliveries(limit=limit)
        return web.json_response({"data": [b.as_json() for b in batches]})

    async def show_batch(self, request: web.Request) -> web.Response:
        batch = await self._store.redelivery(request.match_info["id"])
        if batch is None:
            return error_response(404, "not_found", "no redelivery batch with that id")
        return web.json_response(batch.as_json())

    async def cancel(self, request: web.Request) -> web.Response:
        try:
            batch = await self._store.cancel_redelivery(request.match_info["id"], now=self._clock())
        except UnknownBatch:
            return error_response(404, "not_found", "no redelivery batch with that id")
        return web.json_response(batch.as_json())
