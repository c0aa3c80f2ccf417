"""The download sink against a real aiohttp server: paths, atomicity, errors, and the SSRF guard."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from receiver.config.settings import SinkSettings
from receiver.errors import NotReady, PermanentError, TransientError
from receiver.netguard import IPAddress, is_public_address
from receiver.sinks.download import DownloadSink
from tests.support.downloads import PNG, enriched, loopback_is_public, ref

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


class MapResolver(AbstractResolver):
    """Resolves made-up names to chosen addresses (a DNS answer the attacker controls)."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host not in self.answers:
            raise OSError(f"unknown host {host}")
        return [
            ResolveResult(
                hostname=host,
                host=a,
                port=port,
                family=socket.AF_INET6 if ":" in a else socket.AF_INET,
                proto=0,
                flags=0,
            )
            for a in self.answers[host]
        ]

    async def close(self) -> None:
        pass


# --- writing files ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "ext"),
    [
        ("image/png", ".png"),
        ("image/jpeg", ".jpg"),
        ("image/webp", ".webp"),
        ("image/gif", ".gif"),
        ("video/mp4", ".mp4"),
        ("video/webm", ".webm"),
        ("video/quicktime", ".mov"),
    ],
)
async def test_writes_the_contract_path_with_the_content_types_extension(
    make_sink: SinkFactory, base: str, downloads: Path, content_type: str, ext: str
) -> None:
    sink = await make_sink(allow_private_networks=True)
    await sink.send(enriched(ref(f"{base}/file?ct={content_type}&sig=secret")))
    expected = downloads / "col_1" / "hero" / f"image-ast_1{ext}"
    assert files_under(downloads) == [expected]
    assert expected.read_bytes() == PNG
    assert sink.bytes_written == len(PNG)
    assert sink.files_written == 1


async def test_octet_stream_takes_a_known_suffix_from_the_url(
    make_sink: SinkFactory, base: str, downloads: Path
) -> None:
    sink = await make_sink(allow_private_networks=True)
    await sink.send(
        enriched(
            ref(f"{base}/octet/clip.webm?sig=x", asset_type="loop", asset_id="a1"),
            ref(f"{base}/octet/tool.exe", asset_type="loop", asset_id="a2"),
        )
    )
    folder = downloads / "col_1" / "hero"
    assert files_under(downloads) == [folder / "loop-a1.webm", folder / "loop-a2.bin"]


async def test_missing_collection_and_item_have_stand_ins(
    make_sink: SinkFactory, base: str, downloads: Path
) -> None:
    sink = await make_sink(allow_private_networks=True)
    await sink.send(enriched(ref(f"{base}/file", collection_id=None, item_name=None)))
    assert files_under(downloads) == [
        downloads / "_unknown-collection" / "_unnamed" / "image-ast_1.png"
    ]


async def test_logs_one_line_per_file_without_the_query_string(
    make_sink: SinkFactory, base: str
) -> None:
    sink = await make_sink(allow_private_networks=True)
    with capture_logs() as logs:
        await sink.send(enriched(ref(f"{base}/file?sig=topsecret")))
    written = [e for e in logs if e["event"] == "file written"]
    assert len(written) == 1
    line = written[0]
    assert line["path"] == os.path.join("col_1", "hero", "image-ast_1.png")
    assert line["bytes"] == len(PNG)
    assert line["asset_type"] == "image"
    assert "topsecret" not in repr(logs)


async def test_redelivery_rewrites_the_same_single_file(
    make_sink: SinkFactory, base: str, downloads: Path, files: Files
) -> None:
    sink = await make_sink(allow_private_networks=True)
    event = enriched(ref(f"{base}/versioned", asset_type="loop"))
    await sink.send(event)
    files.version = b"v2-longer"
    await sink.send(event)
    target = downloads / "col_1" / "hero" / "loop-ast_1.mp4"
    assert files_under(downloads) == [target]
    assert target.read_bytes() == b"v2-longer"
    assert files.hits["/versioned"] == 2


# --- atomicity ----------------------------------------------------------------------------


@pytest.fixture
async def truncating_server() -> AsyncIterator[str]:
    """A raw server promising 100 kB and closing the connection after 10 kB."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: 100000\r\n\r\n"
            + b"x" * 10_000
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.close()
        await srv.wait_closed()


async def test_a_connection_closed_mid_stream_leaves_nothing(
    make_sink: SinkFactory, truncating_server: str, downloads: Path
) -> None:
    sink = await make_sink(allow_private_networks=True)
    with pytest.raises(TransientError) as caught:
        await sink.send(enriched(ref(f"{truncating_server}/file.png?sig=abc")))
    assert not isinstance(caught.value, NotReady)
    assert "abc" not in str(caught.value)
    assert files_under(downloads) == []
    assert sink.bytes_written == 0


async def test_a_failed_rewrite_keeps_the_previous_file(
    make_sink: SinkFactory, base: str, truncating_server: str, downloads: Path
) -> None:
    sink = await make_sink(allow_private_networks=True)
    await sink.send(enriched(ref(f"{base}/file")))
    with pytest.raises(TransientError):
        await sink.send(enriched(ref(f"{truncating_server}/file")))
    target = downloads / "col_1" / "hero" / "image-ast_1.png"
    assert files_under(downloads) == [target]
    assert target.read_bytes() == PNG


async def test_a_timeout_is_transient_and_leaves_nothing(
    make_sink: SinkFactory, base: str, downloads: Path
) -> None:
    sink = await make_sink(allow_private_networks=True, timeout_seconds=0.3)
    with pytest.raises(TransientError, match="timed out"):
        await sink.send(enriched(ref(f"{base}/slow")))
    assert files_under(downloads) == []


# --- statuses -------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [404, 403])
async def test_404_and_403_are_not_ready(
    make_sink: SinkFactory, base: str, downloads: Path, code: int
) -> None:
    sink = await make_sink(allow_private_networks=True)
    with pytest.raises(NotReady) as caught:
        await sink.send(enriched(ref(f"{base}/status/{code}", asset_type="sticker_image")))
    assert caught.value.message == f"asset sticker_image ast_1 file not ready (HTTP {code})"
    assert files_under(downloads) == []


async def test_a_file_not_ready_does_not_stop_the_others(
    make_sink: SinkFactory, base: str, downloads: Path
) -> None:
    sink = await make_sink(allow_private_networks=True)
    event = enriched(
        ref(f"{base}/status/404", asset_type="loop", asset_id="a1"),
        ref(f"{base}/file", asset_type="image", asset_id="a2"),
    )
    with pytest.raises(NotReady, match="asset loop a1 file not ready"):
        await sink.send(event)
    assert files_under(downloads) == [downloads / "col_1" / "hero" / "image-a2.png"]


@pytest.mark.parametrize("code", [500, 502, 503])
async def test_5xx_is_transient(make_sink: SinkFactory, base: str, code: int) -> None:
    sink = await make_sink(allow_private_networks=True)
    with pytest.raises(TransientError, match=f"HTTP {code}") as caught:
        await sink.send(enriched(ref(f"{base}/status/{code}")))
    assert not isinstance(caught.value, NotReady)


async def test_429_is_transient_with_retry_after(make_sink: SinkFactory, base: str) -> None:
    sink = await make_sink(allow_private_networks=True)
    with pytest.raises(TransientError) as caught:
        await sink.send(enriched(ref(f"{base}/status/429")))
    assert caught.value.retry_after == 7.0


@pytest.mark.parametrize("code", [400, 410, 451])
async def test_other_4xx_is_permanent(make_sink: SinkFactory, base: str, code: int) -> None:
    sink = await make_sink(allow_private_networks=True)
    with pytest.raises(PermanentError, match=f"HTTP {code}"):
        await sink.send(enriched(ref(f"{base}/status/{code}")))


async def test_connection_refused_is_transient(make_sink: SinkFactory) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sink = await make_sink(allow_private_networks=True)
    with pytest.raises(TransientError):
        await sink.send(enriched(ref(f"http://127.0.0.1:{port}/x")))


@pytest.mark.parametrize("path", ["/big", "/big-chunked"])
async def test_max_file_bytes_is_permanent_and_leaves_nothing(
    make_sink: SinkFactory, base: str, downloads: Path, path: str
) -> None:
    sink = await make_sink(allow_private_networks=True, max_file_bytes=50_000)
    with pytest.raises(PermanentError, match="max_file_bytes"):
        await sink.send(enriched(ref(f"{base}{path}")))
    assert files_under(downloads) == []
    assert sink.bytes_written == 0


async def test_a_file_of_exactly_max_file_bytes_is_written(
    make_sink: SinkFactory, base: str, downloads: Path
) -> None:
    sink = await make_sink(allow_private_networks=True, max_file_bytes=200_000)
    await sink.send(enriched(ref(f"{base}/big-chunked")))
    assert [p.stat().st_size for p in files_under(downloads)] == [200_000]


# --- hostile names -------------------------------------------------------------------------

HOSTILE = ["..", "../../etc", "/abs", "/", "a/b", "a\\b", "nul\x00byte", "x" * 500, "CON", "", "."]


@pytest.mark.parametrize("hostile", HOSTILE)
async def test_hostile_names_never_leave_the_directory(
    make_sink: SinkFactory, base: str, tmp_path: Path, downloads: Path, hostile: str
) -> None:
    sink = await make_sink(allow_private_networks=True)
    event = enriched(
        ref(f"{base}/file", collection_id=hostile, asset_id="c"),
        ref(f"{base}/file", item_name=hostile, asset_id="i"),
        ref(f"{base}/file", asset_type=hostile, asset_id="t"),
        ref(f"{base}/file", asset_id=hostile),
        ref(f"{base}/file", collection_id=hostile, item_name=hostile, asset_type=hostile),
    )
    await sink.send(event)
    everything = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert everything, "files were written"
    root = downloads.resolve()
    for path in everything:
        resolved = path.resolve()
        assert resolved.is_relative_to(root), path
        relative = resolved.relative_to(root)
        assert len(relative.parts) == 3, relative
        assert all(part not in ("", ".", "..") for part in relative.parts)
        assert all(len(part.encode()) <= 255 for part in relative.parts)
    assert sink.files_written == 5


# --- the SSRF guard ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/file",
        "http://localhost:{port}/file",
        "http://[::1]:{port}/file",
        "http://10.0.0.1/file",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:127.0.0.1]:{port}/file",
        "http://0.0.0.0:{port}/file",
        "http://127.1:{port}/file",
        "http://2130706433:{port}/file",
    ],
)
async def test_private_destinations_are_refused(
    make_sink: SinkFactory, server: TestServer, files: Files, downloads: Path, url: str
) -> None:
    sink = await make_sink()  # allow_private_networks defaults to false
    with pytest.raises(PermanentError, match="refused"):
        await sink.send(enriched(ref(url.format(port=server.port))))
    assert files.hits == {}
    assert files_under(downloads) == []


async def test_a_name_resolving_to_private_addresses_is_refused(make_sink: SinkFactory) -> None:
    resolver = MapResolver({"cdn.evil.test": ["10.0.0.5", "169.254.169.254", "::1"]})
    sink = await make_sink(resolver=resolver)
    with pytest.raises(PermanentError, match=r"refused: cdn\.evil\.test resolves to a private"):
        await sink.send(enriched(ref("http://cdn.evil.test/a.png")))


async def test_only_the_checked_answers_are_connected_to(
    make_sink: SinkFactory, server: TestServer, downloads: Path
) -> None:
    # 127.0.0.1 counts as public for this test; 127.0.0.2 does not and is never tried.
    resolver = MapResolver({"cdn.test": ["127.0.0.2", "127.0.0.1"], "only-bad.test": ["127.0.0.2"]})
    sink = await make_sink(policy=loopback_is_public, resolver=resolver)
    await sink.send(enriched(ref(f"http://cdn.test:{server.port}/file")))
    assert len(files_under(downloads)) == 1
    with pytest.raises(PermanentError, match="refused"):
        await sink.send(enriched(ref(f"http://only-bad.test:{server.port}/file")))


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.2:{port}/file",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "http://[::1]:{port}/file",
        "http://[::ffff:10.0.0.1]/",
        "http://internal.test:{port}/file",
        "file:///etc/passwd",
        "ftp://example.com/file",
    ],
)
async def test_a_redirect_to_a_private_address_is_refused(
    make_sink: SinkFactory, server: TestServer, base: str, files: Files, target: str
) -> None:
    resolver = MapResolver({"internal.test": ["10.1.2.3"]})
    sink = await make_sink(policy=loopback_is_public, resolver=resolver)
    location = target.format(port=server.port)
    with pytest.raises(PermanentError, match="refused"):
        await sink.send(enriched(ref(f"{base}/redirect?to={location}")))
    assert files.hits == {"/redirect": 1}


async def test_a_redirect_to_an_allowed_address_is_followed(
    make_sink: SinkFactory, base: str, downloads: Path, files: Files
) -> None:
    sink = await make_sink(policy=loopback_is_public)
    await sink.send(enriched(ref(f"{base}/redirect?to=/octet/clip.mp4")))
    assert files_under(downloads) == [downloads / "col_1" / "hero" / "image-ast_1.mp4"]
    assert files.hits == {"/redirect": 1, "/octet/clip.mp4": 1}


async def test_a_redirect_loop_is_permanent(
    make_sink: SinkFactory, base: str, files: Files
) -> None:
    sink = await make_sink(policy=loopback_is_public)
    with pytest.raises(PermanentError, match="too many redirects"):
        await sink.send(enriched(ref(f"{base}/loop")))
    assert files.hits == {"/loop": 6}


@pytest.mark.parametrize("allow", [False, True])
@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://example.com/a.png", "gopher://127.0.0.1/", "not a url"]
)
async def test_non_http_schemes_are_refused(
    make_sink: SinkFactory, downloads: Path, url: str, allow: bool
) -> None:
    sink = await make_sink(allow_private_networks=allow)
    with pytest.raises(PermanentError, match="only http"):
        await sink.send(enriched(ref(url)))
    assert files_under(downloads) == []


async def test_refusals_are_logged_without_the_query_string(make_sink: SinkFactory) -> None:
    sink = await make_sink()
    with capture_logs() as logs, pytest.raises(PermanentError):
        await sink.send(enriched(ref("http://169.254.169.254/x?token=hunter2")))
    assert [e["event"] for e in logs] == ["download refused"]
    assert "hunter2" not in repr(logs)


async def test_stale_temporary_files_of_a_killed_run_are_removed(tmp_path):
    import os
    import time as _time

    from receiver.sinks.atomic_files import STALE_TEMP_SECONDS, remove_stale_temp_files

    folder = tmp_path / "c" / "item"
    folder.mkdir(parents=True)
    stale = folder / ".image-1.png.tmp-abc123"
    fresh = folder / ".image-2.png.tmp-def456"
    kept = folder / "image-3.png"
    for path in (stale, fresh, kept):
        path.write_bytes(b"x")
    old = _time.time() - STALE_TEMP_SECONDS - 60
    os.utime(stale, (old, old))
    os.utime(kept, (old, old))
    assert remove_stale_temp_files(tmp_path, _time.time()) == 1
    assert not stale.exists() and fresh.exists() and kept.exists()
