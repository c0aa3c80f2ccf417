"""The admin API of pull mode: ``POST /admin/watch`` and ``GET /admin/watch``."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from receiver.config.settings import Settings
from receiver.intake.endpoint import error_response, page_window
from receiver.pull.watch import BadJobId, watch_jobs
from receiver.store.base import Store
from receiver.store.pull import WATCH_STATES

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Job ids one request may add.
MAX_JOB_IDS = 1000


class WatchAdmin:
    """Handlers of the watch list on the ops listener (behind the admin token)."""

    def __init__(
        self,
        *,
        store: Store,
        settings: Settings,
        on_watch: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._settings = settings
        self._on_watch = on_watch
        self._clock = clock

    def routes(self, guard: Callable[[Handler], Handler]) -> list[web.RouteDef]:
        return [
            web.get("/admin/watch", guard(self.list_watches)),
            web.post("/admin/watch", guard(self.add_watches)),
        ]

    async def add_watches(self, request: web.Request) -> web.Response:
        """``{"job_ids": [...]}`` -> 202 ``{"watching": [<job id>...], "data": [<watch>...]}``
        (each job's watch as it now is: a job already done stays done); 400 for a bad body."""
        try:
            body = await request.json()
        except ValueError:
            return error_response(400, "invalid_request", "the body must be a JSON object")
        job_ids = body.get("job_ids") if isinstance(body, dict) else None
        if not isinstance(job_ids, list) or not job_ids:
            return error_response(
                400, "invalid_request", 'the body must be {"job_ids": [<job id>, ...]}'
            )
        if len(job_ids) > MAX_JOB_IDS:
            return error_response(
                400, "invalid_request", f"at most {MAX_JOB_IDS} job ids per request"
            )
        try:
            records = await watch_jobs(self._store, self._settings, job_ids, now=self._clock())
        except BadJobId as exc:
            return error_response(400, "invalid_request", str(exc))
        self._on_watch()
        return web.json_response(
            {"watching": [r.job_id for r in records], "data": [r.as_json() for r in records]},
            status=202,
        )

    async def list_watches(self, request: web.Request) -> web.Response:
        """The watch list, newest first; ``?state=``, ``limit`` (1..1000), ``offset``."""
        state = request.query.get("state")
        if state is not None and state not in WATCH_STATES:
            return error_response(
                400, "invalid_request", f"state must be one of {', '.join(WATCH_STATES)}"
            )
        window = page_window(request, 100)
        if isinstance(window, web.Response):
            return window
        limit, offset = window
        records = await self._store.list_watches(state=state, limit=limit, offset=offset)
        return web.json_response({"data": [r.as_json() for r in records]})
