"""A hand-written upstream for the drift tests: ``/v1/openapi.json`` answers what a test sets.

Not the project's simulator: each test says what the document is (a dict, raw bytes), or how
the answer misbehaves (a status, no answer until released, a body of many megabytes streamed
in chunks). ``GET /v1/jobs/{id}``, ``/v1/assets/{id}`` and ``/v1/collections/{id}/assets``
answer the objects a test puts in :attr:`OpenApiUpstream.jobs`, ``assets`` and ``pages``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

_MB = 1024 * 1024


class OpenApiUpstream:
    """The app; ``base_url`` (ending in ``/v1``) is set once it is served."""

    def __init__(self) -> None:
        self.base_url = ""
        self.document: bytes = b"{}"
        self.status = 200
        self.hanging = False
        self.stream_bytes = 0  # > 0: a body of this many bytes, in 1 MB chunks
        self.declared_length = False  # with stream_bytes: say the length up front
        self.released = asyncio.Event()
        self.spec_requests: list[dict[str, str]] = []
        self.jobs: dict[str, dict[str, Any]] = {}
        self.assets: dict[str, dict[str, Any]] = {}
        self.pages: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {}

    # -- what /openapi.json answers ---------------------------------------------------------

    def serve(self, document: dict[str, Any] | bytes, status: int = 200) -> None:
        self.document = document if isinstance(document, bytes) else json.dumps(document).encode()
        self.status, self.hanging, self.stream_bytes = status, False, 0

    def hang(self) -> None:
        """Answer nothing until :meth:`release` (then what :meth:`serve` set)."""
        self.hanging = True
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    def stream(self, total_bytes: int, *, declared: bool = False) -> None:
        """A JSON-looking body of ``total_bytes``, streamed (never held whole)."""
        self.stream_bytes, self.declared_length, self.hanging = total_bytes, declared, False

    # -- serving ----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/openapi.json", self._document)
        app.router.add_get("/v1/jobs/{id}", self._job)
        app.router.add_get("/v1/assets/{id}", self._asset)
        app.router.add_get("/v1/collections/{id}/assets", self._page)
        return app

    async def _document(self, request: web.Request) -> web.StreamResponse:
        self.spec_requests.append(dict(request.headers))
        if self.hanging:
            await self.released.wait()
        if self.stream_bytes:
            return await self._streamed(request)
        return web.Response(status=self.status, body=self.document, content_type="application/json")

    async def _streamed(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        if self.declared_length:
            response.content_length = self.stream_bytes
        else:
            response.enable_chunked_encoding()
        await response.prepare(request)
        chunk = b" " * _MB
        sent = 0
        try:
            await response.write(b"[")
            while sent < self.stream_bytes:
                await response.write(chunk)
                sent += len(chunk)
        except (ConnectionResetError, RuntimeError):
            pass  # the receiver hung up on it, as it should
        return response

    async def _job(self, request: web.Request) -> web.Response:
        return _found({"data": self.jobs.get(request.match_info["id"])})

    async def _asset(self, request: web.Request) -> web.Response:
        return _found({"data": self.assets.get(request.match_info["id"])})

    async def _page(self, request: web.Request) -> web.Response:
        page = self.pages.get(request.match_info["id"])
        if page is None:
            return _found({"data": None})
        data, pagination = page
        return _found({"data": data, "meta": {"pagination": pagination}})


def _found(envelope: dict[str, Any]) -> web.Response:
    if envelope["data"] is None:
        body = {"error": {"code": "not_found", "message": "Resource not found"}}
        return web.json_response(body, status=404)
    return web.json_response(envelope)


async def serve_openapi_upstream(aiohttp_server: Any) -> OpenApiUpstream:
    upstream = OpenApiUpstream()
    server = await aiohttp_server(upstream.app())
    upstream.base_url = str(server.make_url("/v1"))
    return upstream
