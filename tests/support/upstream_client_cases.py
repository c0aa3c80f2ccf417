"""What the upstream-client tests share: the real simulator served, a client of it, counters.

The fixtures ``sim``, ``server``, ``session``, ``metrics`` and ``client`` give a test module the
simulator, its server, an aiohttp session, the metrics and an ``UpstreamClient`` of that server;
a test module imports them by name (and lists them in ``__all__``). ``count`` and ``observed``
read the client's request metrics; ``scripted_server`` serves answers the simulator never gives.
Used by tests/integration/test_upstream_{calls,retries,refusals}.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from receiver.observe.metrics import Metrics
from receiver.simulator import Simulator
from receiver.upstream.client import UpstreamClient

API_KEY = "service_" + "ab" * 32


@pytest.fixture
def sim() -> Simulator:
    return Simulator(api_key=API_KEY, seed=7)


@pytest.fixture
async def server(sim: Simulator) -> AsyncIterator[TestServer]:
    server = TestServer(sim.create_app())
    await server.start_server()
    yield server
    await server.close()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def client(server: TestServer, session: aiohttp.ClientSession, metrics: Metrics) -> UpstreamClient:
    return UpstreamClient(
        session=session,
        base_url=str(server.make_url("/v1")),
        api_key=API_KEY,
        timeout=5.0,
        metrics=metrics,
    )


def count(metrics: Metrics, endpoint: str, status: str) -> float:
    value = metrics.registry.get_sample_value(
        "receiver_upstream_requests_total", {"endpoint": endpoint, "status": status}
    )
    return value or 0.0


def observed(metrics: Metrics, endpoint: str) -> float:
    value = metrics.registry.get_sample_value(
        "receiver_upstream_request_seconds_count", {"endpoint": endpoint}
    )
    return value or 0.0


class scripted_server:
    """A one-handler server mounted at /v1/..., for answers the simulator never gives."""

    def __init__(self, handler: Callable[[web.Request], Any]) -> None:
        app = web.Application()
        app.router.add_route("*", "/v1/{tail:.*}", handler)
        self.server = TestServer(app)

    async def __aenter__(self) -> str:
        await self.server.start_server()
        return str(self.server.make_url("/v1"))

    async def __aexit__(self, *exc: object) -> None:
        await self.server.close()
