"""The simulator over HTTP: the upstream's API under ``/v1`` and the files under ``/files``.

:class:`Simulator` is :class:`~receiver.simulator.state.SimulatorState` (with the version
switches of :mod:`receiver.simulator.versions`) and an aiohttp application
(:meth:`Simulator.create_app`): the envelopes (``{"data": ...}`` /
``{"error": {"code", "message"}}``), Bearer authentication, the ``Service-API-Version`` check,
the fault knobs applied to each API call, long-polls, the OpenAPI document (public, at
``/v1/openapi.json``) and CDN-style answers for the files.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Middleware

from receiver.simulator.model import EVENT_NAMES, TERMINAL_STATUSES
from receiver.simulator.pulling import page_params, pagination
from receiver.simulator.versions import OPENAPI_PATH, VERSION_HEADER, UpstreamVersions

_LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_MAX_WAIT_SECONDS = 120.0
_DEFAULT_WAIT_SECONDS = 30.0
_TICK = 0.02

_STOPPING_KEY = web.AppKey("simulator_stopping", asyncio.Event)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Simulator(UpstreamVersions):
    """The upstream service in memory, served over HTTP.

    The state, the fault knobs and the request counters are
    :class:`~receiver.simulator.state.SimulatorState`'s, the version switches
    :class:`~receiver.simulator.versions.UpstreamVersions`'.
    """

    # ----------------------------------------------------------------- HTTP

    def create_app(self) -> web.Application:
        """An aiohttp application serving the API under ``/v1`` and the files under ``/files``."""
        app = web.Application(middlewares=[self._middleware()])
        app[SIMULATOR_KEY] = self
        app[_STOPPING_KEY] = asyncio.Event()

        async def on_shutdown(app: web.Application) -> None:
            app[_STOPPING_KEY].set()  # ends long-polls and latency sleeps at once

        app.on_shutdown.append(on_shutdown)
        app.router.add_get(OPENAPI_PATH, self._openapi)
        app.router.add_get("/v1/jobs/{id}", self._get_job)
        app.router.add_get("/v1/assets/{id}", self._get_asset)
        app.router.add_get("/v1/collections/{id}/assets", self._list_collection_assets)
        app.router.add_get("/v1/webhooks", self._list_webhooks)
        app.router.add_post("/v1/webhooks", self._create_webhook)
        app.router.add_delete("/v1/webhooks/{id}", self._delete_webhook)
        app.router.add_get("/files/{name}", self._get_file)
        return app

    def _middleware(self) -> Middleware:
        @web.middleware
        async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else request.path
            key = f"{request.method} {route}"
            self.requests[key] += 1
            if not request.path.startswith("/v1/"):
                response = await handler(request)
            else:
                request_id = f"req_{self.random.getrandbits(64):016x}"
                response = await self._api_call(request, handler, request_id)
                response.headers["Request-Id"] = request_id
            if route == "/v1/jobs/{id}":
                response.headers.update(self.job_endpoint_headers())
            self.responses[key, response.status] += 1
            self.last_request_at = time.monotonic()
            return response

        return middleware

    async def _api_call(
        self, request: web.Request, handler: Handler, request_id: str
    ) -> web.StreamResponse:
        if self.latency_seconds > 0:
            await _sleep(request.app, self.latency_seconds)
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        public = request.path == OPENAPI_PATH  # the document needs no key and no version
        # An empty api_key means "accept any credential" (local runs without a key).
        if self.api_key and not public:
            if not header:
                return _error(401, "unauthorized", "Missing API key.", request_id)
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode(), self.api_key.encode()
            ):
                return _error(401, "unauthorized", "Invalid or revoked API key.", request_id)
        refused = None if public else self.version_refusal(request.headers.get(VERSION_HEADER))
        if refused is not None:
            return _error(400, "validation_failed", refused, request_id, param=VERSION_HEADER)
        resource = request.match_info.route.resource
        burst, burst_retry_after = self.take_burst(
            f"{request.method} {resource.canonical if resource is not None else request.path}"
        )
        if burst or self._roll(self.rate_limit_fraction):
            response = _error(429, "rate_limited", "Too many requests.", request_id)
            value = burst_retry_after if burst else self.retry_after
            if value is not None:
                response.headers["Retry-After"] = (
                    value if isinstance(value, str) else str(math.ceil(value))
                )
            return response
        if self._roll(self.error_fraction):
            status = self.error_status
            code = "internal" if status == 500 else "upstream_error"
            return _error(status, code, "Simulated server error.", request_id)
        if self._roll(self.invalid_json_fraction):
            return web.Response(
                status=200, body=b'{"data": {"id": "trunc', content_type="application/json"
            )
        try:
            return await handler(request)
        except web.HTTPException as exc:  # no route, wrong method
            code = "not_found" if exc.status == 404 else "method_not_allowed"
            return _error(exc.status, code, exc.reason, request_id)

    def _base(self, request: web.Request) -> str:
        return self.public_base_url or str(request.url.origin())

    async def _openapi(self, _request: web.Request) -> web.Response:
        return web.json_response(self.openapi_document())

    async def _get_job(self, request: web.Request) -> web.Response:
        job_id = request.match_info["id"]
        if job_id not in self.jobs:
            return _error(404, "not_found", "Job not found.")
        if request.query.get("wait", "").lower() in ("true", "1"):
            raw = request.query.get("timeout", str(_DEFAULT_WAIT_SECONDS))
            try:
                timeout = float(raw)
            except ValueError:
                timeout = -1.0
            if not math.isfinite(timeout) or timeout < 0:
                return _error(
                    400,
                    "validation_failed",
                    "timeout must be a number of seconds.",
                    param="timeout",
                )
            loop = asyncio.get_running_loop()
            deadline = loop.time() + min(timeout, _MAX_WAIT_SECONDS)
            stopping = request.app[_STOPPING_KEY]
            self.long_poll_started(job_id)
            try:
                while self.job_status(job_id) not in TERMINAL_STATUSES and not stopping.is_set():
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    await asyncio.sleep(min(_TICK, remaining))
            finally:
                self.long_poll_ended(job_id)
        if self.job_status(job_id) in TERMINAL_STATUSES:
            self.fetched.add(f"job:{job_id}")
        return _data(self.job_json(job_id, self._base(request)))

    async def _get_asset(self, request: web.Request) -> web.Response:
        asset_id = request.match_info["id"]
        if asset_id not in self.assets or self.asset_missing(asset_id):
            return _error(404, "not_found", "Asset not found.")
        if self.asset_status(asset_id) == "completed":
            self.fetched.add(f"asset:{asset_id}")
        return _data(self.asset_json(asset_id, self._base(request)))

    async def _list_collection_assets(self, request: web.Request) -> web.Response:
        collection_id = request.match_info["id"]
        assets = self.collection_assets(collection_id)
        if not assets and not any(j.collection_id == collection_id for j in self.jobs.values()):
            return _error(404, "not_found", "Collection not found.")
        params = page_params(request.query)
        if params is None:
            return _error(400, "validation_failed", "limit is 1 to 100 and offset >= 0.")
        limit, offset = params
        limit = self.shape.page_limit(f"{collection_id}:{offset}", limit)
        with_urls = request.query.get("include_file_urls", "true").lower() != "false"
        page = assets[offset : offset + limit]
        data = []
        for asset in page:
            item = self.asset_json(asset.id, self._base(request))
            if not with_urls:
                item.pop("file_url")
            data.append(item)
        return _data(data, meta=pagination(len(assets), limit, offset, len(page)))

    async def _get_file(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            expires = int(request.query.get("expires", ""))
        except ValueError:
            return _cdn_error(403, "AccessDenied", "missing or malformed expires")
        sig = request.query.get("sig", "")
        if not hmac.compare_digest(sig.encode(), self._sign(name, expires).encode()):
            return _cdn_error(403, "AccessDenied", "signature does not match")
        if self.now() >= expires:
            return _cdn_error(403, "AccessDenied", "request has expired")
        asset_id = self._files.get(name)
        if asset_id is None or self.asset_status(asset_id) != "completed":
            return _cdn_error(404, "NoSuchKey", "the file does not exist yet")
        asset = self.assets[asset_id]
        return web.Response(
            body=asset.data,
            content_type=asset.content_type,
            headers={"Cache-Control": "private, max-age=60"},
        )

    async def _list_webhooks(self, request: web.Request) -> web.Response:
        params = page_params(request.query)
        if params is None:
            return _error(400, "validation_failed", "limit is 1 to 100 and offset >= 0.")
        limit, offset = params
        limit = self.shape.page_limit(f"webhooks:{offset}", limit)
        hooks = list(self.webhooks.values())
        page = hooks[offset : offset + limit]
        meta = pagination(len(hooks), limit, offset, len(page))
        return _data([hook.as_json() for hook in page], meta=meta)

    async def _create_webhook(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "validation_failed", "The body is not JSON.")
        if not isinstance(body, dict):
            return _error(400, "validation_failed", "The body must be a JSON object.")
        url = body.get("url")
        if not isinstance(url, str) or not _acceptable_webhook_url(url):
            return _error(
                400,
                "validation_failed",
                "url must be an https URL (or http on localhost).",
                param="url",
            )
        events = body.get("events")
        if events is None:
            events = list(EVENT_NAMES)
        elif (
            not isinstance(events, list)
            or not events
            or not all(isinstance(e, str) and e in EVENT_NAMES for e in events)
        ):
            return _error(
                400,
                "validation_failed",
                f"events must be a non-empty subset of {list(EVENT_NAMES)}.",
                param="events",
            )
        hook = self.add_webhook(url, events)
        return _data(hook.as_json(with_secret=True), status=201)

    async def _delete_webhook(self, request: web.Request) -> web.Response:
        if self.webhooks.pop(request.match_info["id"], None) is None:
            return _error(404, "not_found", "Webhook not found.")
        return web.Response(status=204)


SIMULATOR_KEY = web.AppKey("simulator", Simulator)


def _acceptable_webhook_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return False
    if not host:
        return False
    return parts.scheme == "https" or (parts.scheme == "http" and host in _LOCAL_HOSTS)


async def _sleep(app: web.Application, seconds: float) -> None:
    """Sleep, but stop early when the application shuts down."""
    stopping = app[_STOPPING_KEY]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not stopping.is_set():
        remaining = deadline - loop.time()
        if remaining <= 0:
            return
        await asyncio.sleep(min(_TICK * 5, remaining))


def _data(data: Any, *, status: int = 200, meta: dict[str, Any] | None = None) -> web.Response:
    body: dict[str, Any] = {"data": data}
    if meta is not None:
        body["meta"] = meta
    return web.json_response(body, status=status)


def _error(
    status: int,
    code: str,
    message: str,
    request_id: str | None = None,
    *,
    param: str | None = None,
) -> web.Response:
    error: dict[str, Any] = {"code": code, "message": message}
    if param is not None:
        error["param"] = param
    if request_id is not None:
        error["request_id"] = request_id
    return web.json_response({"error": error}, status=status)


def _cdn_error(status: int, code: str, message: str) -> web.Response:
    """A CDN-style refusal: XML like S3/CloudFront, not the API's envelope."""
    body = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
    return web.Response(status=status, text=body, content_type="application/xml")
