"""The download sink against a real aiohttp server: the SSRF guard.

Private destinations (literal addresses, names resolving to them, redirects to them) and
non-http schemes are refused before anything is fetched, only the checked DNS answers are
connected to, redirect loops end, and refusals are logged without the query string.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from receiver.errors import PermanentError
from tests.support.download_sink_cases import (
    Files,
    SinkFactory,
    base,
    downloads,
    files,
    files_under,
    make_sink,
    server,
)
from tests.support.downloads import MapResolver, enriched, loopback_is_public, ref

__all__ = ["base", "downloads", "files", "make_sink", "server"]  # fixtures, used by name


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
