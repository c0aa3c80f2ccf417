"""DNS answers that change between lookups (DNS rebinding) never get a download to a private
address: the address connected to is the address checked, whatever the next answer says."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from receiver.config.settings import SinkSettings
from receiver.errors import PermanentError
from receiver.sinks.download import DownloadSink
from tests.support.downloads import PNG, enriched, loopback_is_public, ref


class RebindingResolver(AbstractResolver):
    """Answers with the next address of ``answers`` at every lookup (the last one repeats)."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = answers
        self.lookups = 0

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        address = self.answers[min(self.lookups, len(self.answers) - 1)]
        self.lookups += 1
        return [
            ResolveResult(
                hostname=host, host=address, port=port, family=socket.AF_INET, proto=0, flags=0
            )
        ]

    async def close(self) -> None:
        pass


@pytest.fixture
async def connected_to(aiohttp_server: Any) -> tuple[int, list[str]]:
    """A file server on every loopback address, recording the address each request reached."""
    reached: list[str] = []

    async def file(request: web.Request) -> web.Response:
        assert request.transport is not None
        reached.append(request.transport.get_extra_info("sockname")[0])
        return web.Response(body=PNG, content_type="image/png")

    app = web.Application()
    app.router.add_get("/file", file)
    server = await aiohttp_server(app, host="0.0.0.0")  # 127.0.0.2 must reach it too
    return server.port, reached


async def download(resolver: AbstractResolver, url: str, directory: Path) -> None:
    """One download by a fresh sink (its own connection pool and DNS cache)."""
    settings = SinkSettings(name="files", type="download", options={"directory": str(directory)})
    # 127.0.0.1 counts as public here; 127.0.0.2 stands for the private address rebinding to.
    sink = DownloadSink(settings, address_policy=loopback_is_public, resolver=resolver)
    await sink.open()
    try:
        await sink.send(enriched(ref(url)))
    finally:
        await sink.close()


async def test_an_answer_turning_private_after_the_first_lookup(
    connected_to: tuple[int, list[str]], tmp_path: Path
) -> None:
    port, reached = connected_to
    resolver = RebindingResolver(["127.0.0.1", "127.0.0.2"])
    url = f"http://cdn.rebind.test:{port}/file"
    await download(resolver, url, tmp_path / "a")
    with pytest.raises(PermanentError, match="refused"):
        await download(resolver, url, tmp_path / "b")
    # One lookup a download, checked and connected to: no second lookup behind the check.
    assert resolver.lookups == 2
    assert reached == ["127.0.0.1"]


async def test_an_answer_turning_public_later_does_not_excuse_the_first(
    connected_to: tuple[int, list[str]], tmp_path: Path
) -> None:
    port, reached = connected_to
    resolver = RebindingResolver(["127.0.0.2", "127.0.0.1"])
    url = f"http://cdn.rebind.test:{port}/file"
    with pytest.raises(PermanentError, match="refused"):
        await download(resolver, url, tmp_path / "a")
    assert reached == []
    await download(resolver, url, tmp_path / "b")
    assert reached == ["127.0.0.1"]


async def test_a_redirect_to_a_name_rebinding_to_a_private_address(
    connected_to: tuple[int, list[str]], aiohttp_server: Any, tmp_path: Path
) -> None:
    port, reached = connected_to

    async def redirect(_request: web.Request) -> web.Response:
        raise web.HTTPFound(f"http://cdn.rebind.test:{port}/file")

    app = web.Application()
    app.router.add_get("/go", redirect)
    origin = await aiohttp_server(app, host="127.0.0.1")
    # The origin's name resolves to 127.0.0.1 once; the redirect's lookup gets 127.0.0.2.
    resolver = RebindingResolver(["127.0.0.1", "127.0.0.2"])
    with pytest.raises(PermanentError, match="refused"):
        await download(resolver, f"http://origin.rebind.test:{origin.port}/go", tmp_path)
    assert reached == []
