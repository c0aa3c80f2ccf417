"""A real Runtime with sinks, for tests: the simulator as upstream, capture servers as peers.

A test module imports the fixtures ``upstream``, ``captures`` and ``receiver`` by name (and lists
them in ``__all__``); ``settings_for``, ``send`` and ``settled`` are plain helpers.
"""

from __future__ import annotations

import uuid
from functools import partial

import pytest

from receiver.app import Runtime
from tests.support.peers import Capture
from tests.support.pipeline import fast_settings
from tests.support.pipeline import send as send_signed
from tests.support.pipeline import settled as wait_settled
from tests.support.upstream import serve_upstream

SECRET = "whsec_sinks"
API_KEY = "service_" + "ef" * 32
SINK_SECRET = "internal-consumer-secret"


@pytest.fixture
async def upstream(aiohttp_server):
    return await serve_upstream(aiohttp_server, api_key=API_KEY, seed=11)


@pytest.fixture
def captures(aiohttp_server):
    """``await captures()`` -> a new capture server with its ``url``."""

    async def make() -> Capture:
        peer = Capture()
        server = await aiohttp_server(peer.app())
        peer.url = str(server.make_url("/in"))
        return peer

    return make


def settings_for(tmp_path, upstream, sinks, **worker):
    return fast_settings(
        upstream,
        secret=SECRET,
        api_key=API_KEY,
        store={"url": f"sqlite:///{tmp_path}/inbox-{uuid.uuid4().hex[:6]}.db"},
        sinks=sinks,
        worker=worker,
    )


@pytest.fixture
async def receiver(aiohttp_client, tmp_path, upstream):
    """``await receiver(sinks, **worker)`` -> (runtime, client) for a running receiver."""
    runtimes = []

    async def start(sinks, **worker):
        runtime = Runtime(settings_for(tmp_path, upstream, sinks, **worker))
        await runtime.__aenter__()
        runtimes.append(runtime)
        client = await aiohttp_client(runtime.public_app())
        return runtime, client

    yield start
    for runtime in runtimes:
        await runtime.close()


send = partial(send_signed, secret=SECRET)
settled = partial(wait_settled, timeout=20.0)


def http(name: str, capture: Capture, **options: object) -> dict[str, object]:
    """An http sink posting to ``capture``, signed with :data:`SINK_SECRET`."""
    return {"name": name, "type": "http", "url": capture.url, "secret": SINK_SECRET, **options}
