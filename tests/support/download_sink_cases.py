"""What the download-sink tests share: a real aiohttp file server, the sink, a made-up DNS.

``Files`` is the test file server (what it serves and how often it was asked); the fixtures
``files``, ``server``, ``base``, ``downloads`` and ``make_sink`` give a test module the server,
its base URL, the download directory and a factory of opened sinks (closed after the test); a
test module imports them by name (and lists them in ``__all__``). ``MapResolver`` answers
made-up names with chosen addresses. Used by tests/integration/test_download_sink_*.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver
from aiohttp.test_utils import TestServer

from receiver.config.settings import SinkSettings
from receiver.netguard import IPAddress, is_public_address
from receiver.sinks.download import DownloadSink
from tests.support.downloads import PNG

SinkFactory = Callable[..., Awaitable[DownloadSink]]


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


class Files:
    """The test file server: what it serves and how often it was asked."""

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}
        self.version = b"v1"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/file", self.file)
        app.router.add_get("/octet/{name}", self.octet)
        app.router.add_get("/versioned", self.versioned)
        app.router.add_get("/status/{code}", self.status)
        app.router.add_get("/big", self.big)
        app.router.add_get("/big-chunked", self.big_chunked)
        app.router.add_get("/redirect", self.redirect)
        app.router.add_get("/slow", self.slow)
        app.router.add_get("/loop", self.loop)
        return app

    def hit(self, request: web.Request) -> None:
        self.hits[request.path] = self.hits.get(request.path, 0) + 1

    async def file(self, request: web.Request) -> web.Response:
        self.hit(request)
        return web.Response(body=PNG, content_type=request.query.get("ct", "image/png"))

    async def octet(self, request: web.Request) -> web.Response:
        self.hit(request)
        return web.Response(body=b"data", content_type="application/octet-stream")

    async def versioned(self, request: web.Request) -> web.Response:
        self.hit(request)
        return web.Response(body=self.version, content_type="video/mp4")

    async def status(self, request: web.Request) -> web.Response:
        self.hit(request)
        code = int(request.match_info["code"])
        headers = {"Retry-After": "7"} if code == 429 else {}
        return web.Response(status=code, text="no", headers=headers)

    async def big(self, request: web.Request) -> web.Response:
        self.hit(request)
        return web.Response(body=b"b" * 200_000, content_type="image/png")

    async def big_chunked(self, request: web.Request) -> web.StreamResponse:
        self.hit(request)
        response = web.StreamResponse(headers={"Content-Type": "image/png"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(20):
            await response.write(b"c" * 10_000)
        await response.write_eof()
        return response

    async def redirect(self, request: web.Request) -> web.Response:
        self.hit(request)
        raise web.HTTPFound(request.query["to"])

    async def loop(self, request: web.Request) -> web.Response:
        self.hit(request)
        raise web.HTTPFound("/loop")

    async def slow(self, request: web.Request) -> web.Response:
        self.hit(request)
        await asyncio.sleep(2)
        return web.Response(body=PNG, content_type="image/png")


@pytest.fixture
def files() -> Files:
    return Files()


@pytest.fixture
async def server(aiohttp_server: Any, files: Files) -> TestServer:
    srv: TestServer = await aiohttp_server(files.app(), host="127.0.0.1")
    return srv


@pytest.fixture
def base(server: TestServer) -> str:
    return f"http://127.0.0.1:{server.port}"


@pytest.fixture
def downloads(tmp_path: Path) -> Path:
    return tmp_path / "downloads"


@pytest.fixture
async def make_sink(downloads: Path) -> AsyncIterator[SinkFactory]:
    sinks: list[DownloadSink] = []

    async def factory(
        *,
        policy: Callable[[IPAddress], bool] = is_public_address,
        resolver: AbstractResolver | None = None,
        timeout_seconds: float = 10.0,
        **options: Any,
    ) -> DownloadSink:
        settings = SinkSettings(
            name="files",
            type="download",
            timeout_seconds=timeout_seconds,
            options={"directory": str(downloads), **options},
        )
        sink = DownloadSink(settings, address_policy=policy, resolver=resolver)
        await sink.open()
        sinks.append(sink)
        return sink

    yield factory
    for sink in sinks:
        await sink.close()
