"""Fixtures for the crash and fault tests: the simulator as upstream."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from receiver.simulator import Simulator
from tests.support.faults import API_KEY, SlowPeers
from tests.support.peers import Capture
from tests.support.upstream import serve_upstream


@pytest.fixture
async def upstream(aiohttp_server: Any) -> Simulator:
    return await serve_upstream(aiohttp_server, api_key=API_KEY, seed=23)


@pytest.fixture(
    params=[
        "download only",
        # the same kills with two slow sinks beside (18-20 s): `make test-slow`
        pytest.param("beside paced and hanging sinks", marks=pytest.mark.slow),
    ]
)
async def slow_peers(request: Any, aiohttp_server: Any) -> Any:
    """``None`` (the download sink alone), or the :class:`SlowPeers` configured beside it."""
    if request.param == "download only":
        yield None
        return
    captures = [Capture(), Capture(), Capture()]
    captures[2].hold = asyncio.Event()
    for capture in captures:
        server = await aiohttp_server(capture.app())
        capture.url = str(server.make_url("/in"))
    yield SlowPeers(*captures)
    captures[2].hold.set()
