"""The download sink against a real aiohttp server: atomicity and failed downloads.

A connection closed mid-stream, a timeout or a failed rewrite leaves nothing (or the previous
file); stale temporary files of a killed run are removed; each HTTP status (404/403 not ready,
5xx and 429 transient, other 4xx permanent), a refused connection and ``max_file_bytes`` end in
the right error.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from receiver.errors import NotReady, PermanentError, TransientError, UrlRefused
from tests.support.download_sink_cases import (
    SinkFactory,
    base,
    downloads,
    files,
    files_under,
    make_sink,
    server,
)
from tests.support.downloads import PNG, enriched, ref

__all__ = ["base", "downloads", "files", "make_sink", "server"]  # fixtures, used by name


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


@pytest.mark.parametrize("code", [400, 401, 410])
async def test_an_expired_url_answer_is_a_refused_url(
    make_sink: SinkFactory, base: str, code: int
) -> None:
    """How object stores answer an expired signed URL: the asset is fetched again."""
    sink = await make_sink(allow_private_networks=True)
    file = ref(f"{base}/status/{code}")
    with pytest.raises(UrlRefused, match=f"HTTP {code}") as caught:
        await sink.send(enriched(file))
    assert caught.value.asset_ids == (file.asset_id,)


@pytest.mark.parametrize("code", [405, 422, 451])
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
