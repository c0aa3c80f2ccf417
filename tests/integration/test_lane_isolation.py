"""Delivery lanes on real stores: a paced sink and a hanging sink delay only themselves.

Each test runs real receivers in-process (webhook -> inbox -> workers -> the simulator as
upstream -> real HTTP peers), on SQLite and on Postgres:

- the fast sinks (a download and an http consumer that answers at once) take at most
  ``MAX_RATIO`` times as long for ``EVENTS`` events with a paced chat sink and an http sink that
  never answers configured beside them as without them (both measured here, same events; on a
  busy machine more pairs of runs are made while the fastest of each kind miss);
- the paced chat sink never exceeds its rate: any window of ``WINDOW`` seconds holds at most
  ``rate * WINDOW + burst`` messages (a token bucket holds at most one second of its rate);
- two replicas on one Postgres hold one lane to its rate together, not each.

The test of the first two points runs in ``make test-slow``: its rounds of hundreds of events,
repeated while the machine is busy, took up to a minute of the parallel suite. ``make test``
keeps the same promise, measured with fewer events, in ``tests/integration/test_lanes.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.signature import webhook_headers
from receiver.simulator import Simulator
from tests.support.helpers import wait_for
from tests.support.peers import Capture
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres

SECRET = "whsec_lanes"
API_KEY = "service_" + "1a" * 32
EVENTS = 300
MAX_RATIO = 1.5
CHAT_RATE = 5.0
WINDOW = 2.0
HANG_TIMEOUT = 2.0
SENDING = 16  # webhooks in flight at once
ROUNDS = 3  # pairs of runs at most
WARM_UP = 30  # events through a receiver before the measured runs

StoreFactory = Callable[[], Awaitable[dict[str, Any]]]


def allowed_in_window(rate: float, window: float) -> int:
    """Messages a lane paced at ``rate`` may send in ``window`` s: its rate plus one burst."""
    burst = max(1.0, rate)
    return int(rate * window + burst) + 1  # + 1: a message on the window's very edge


@pytest.fixture
async def upstream(aiohttp_server: Any) -> Simulator:
    sim = Simulator(api_key=API_KEY, seed=31)
    server = await aiohttp_server(sim.create_app())
    sim.base_url = str(server.make_url("/v1"))
    return sim


@pytest.fixture
def peer(aiohttp_server: Any) -> Callable[..., Awaitable[Capture]]:
    """``await peer(hang=False)`` -> a capture server with its ``url``; ``hang``: never answers."""
    made: list[Capture] = []

    async def make(*, hang: bool = False) -> Capture:
        capture = Capture()
        if hang:
            capture.hold = asyncio.Event()
        # The test server cancels a handler whose client went away: a request the receiver gave
        # up on stops waiting here too.
        server = await aiohttp_server(capture.app())
        capture.url = str(server.make_url("/in"))
        made.append(capture)
        return capture

    yield make
    for capture in made:
        if capture.hold is not None:
            capture.hold.set()


@pytest.fixture(params=["sqlite", "postgres"])
async def new_store(request: Any, tmp_path: Any) -> AsyncIterator[StoreFactory]:
    """``await new_store()`` -> the [store] table of a fresh, empty inbox of the backend."""
    async with contextlib.AsyncExitStack() as stack:

        async def make() -> dict[str, Any]:
            if request.param == "sqlite":
                return {"url": f"sqlite:///{tmp_path}/inbox-{uuid.uuid4().hex[:8]}.db"}
            schema = await stack.enter_async_context(fresh_schema())
            return {"url": POSTGRES_URL, "schema": schema, "pool_size": 4}

        if request.param == "postgres":
            require_postgres()
        yield make


@pytest.fixture
async def receivers(aiohttp_client: Any, upstream: Simulator) -> AsyncIterator[Any]:
    """``await receivers(store, sinks)`` -> (runtime, client) of a running receiver."""
    runtimes: list[Runtime] = []

    async def start(store: dict[str, Any], sinks: list[dict[str, Any]]) -> tuple[Runtime, Any]:
        settings = parse_settings(
            {
                "server": {"shutdown_timeout_seconds": 1},
                "webhook": {"secrets": [SECRET]},
                "api": {"base_url": upstream.base_url, "api_key": API_KEY, "timeout_seconds": 5},
                "store": store,
                "worker": {
                    "concurrency": 8,
                    "backoff_initial_seconds": 0.05,
                    "backoff_max_seconds": 0.5,
                    "poll_interval_seconds": 0.1,
                },
                "sinks": sinks,
            },
            env={},
        )
        runtime = Runtime(settings)
        await runtime.__aenter__()
        runtimes.append(runtime)
        return runtime, await aiohttp_client(runtime.public_app())

    yield start
    for runtime in runtimes:
        await runtime.close()


def fast_sinks(tmp_path: Any, consumer: Capture) -> list[dict[str, Any]]:
    return [
        {
            "name": "files",
            "type": "download",
            "directory": str(tmp_path / f"downloads-{uuid.uuid4().hex[:8]}"),
            "allow_private_networks": True,
        },
        {"name": "consumer", "type": "http", "url": consumer.url, "secret": "c" * 24},
    ]


def chat_sink(chat: Capture, rate: float) -> dict[str, Any]:
    return {
        "name": "chat",
        "type": "slack",
        "format": "slack",
        "url": chat.url,
        "rate_limit_per_second": rate,
    }


def slow_sinks(chat: Capture, hang: Capture) -> list[dict[str, Any]]:
    return [
        chat_sink(chat, CHAT_RATE),
        {
            "name": "stuck",
            "type": "http",
            "url": hang.url,
            "secret": "s" * 24,
            "timeout_seconds": HANG_TIMEOUT,
            "max_attempts": 1000,  # keeps retrying for the whole test
        },
    ]


async def send_all(client: Any, payloads: list[dict[str, Any]]) -> None:
    slots = asyncio.Semaphore(SENDING)

    async def send(payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        headers = webhook_headers(
            SECRET, body, int(time.time()), event_id=payload["id"], event_name=payload["event"]
        )
        async with slots:
            response = await client.post("/webhooks", data=body, headers=headers)
            assert response.status == 200, await response.text()

    await asyncio.gather(*(send(p) for p in payloads))


def delivered(runtime: Runtime, sink: str) -> float:
    value = runtime.metrics.registry.get_sample_value(
        "receiver_sink_deliveries_total", {"sink": sink, "outcome": "success"}
    )
    return value or 0.0


async def fast_sinks_seconds(
    runtime: Runtime, client: Any, payloads: list[dict[str, Any]], *, timeout: float
) -> float:
    """Seconds from the first webhook sent to every download and consumer delivery done."""
    started = time.monotonic()
    await send_all(client, payloads)

    async def done() -> bool:
        return all(delivered(runtime, s) >= len(payloads) for s in ("files", "consumer"))

    await wait_for(done, timeout, 0.02, f"{len(payloads)} events at the fast sinks")
    return time.monotonic() - started


@pytest.mark.slow  # 600 events and more a round, rounds while the machine is busy: 10-50 s
async def test_a_paced_and_a_hanging_sink_hold_back_neither_fast_sink(
    new_store: StoreFactory, receivers: Any, upstream: Simulator, peer: Any, tmp_path: Any
) -> None:
    payloads = [upstream.add_job("logo") for _ in range(EVENTS)]
    consumer = await peer()
    # A first receiver pays for what runs once per process (imports, connection set-up, code
    # paths taken first): a short warm-up keeps that out of the measured runs.
    runtime, client = await receivers(await new_store(), fast_sinks(tmp_path, consumer))
    warm_up = [upstream.add_job("logo") for _ in range(WARM_UP)]
    await fast_sinks_seconds(runtime, client, warm_up, timeout=60)
    await runtime.close()
    ratios: list[str] = []
    fastest: dict[str, float] = {}
    # On a machine shared with other work (the suite's other workers, other builds) one pair of
    # runs can be unlucky: load only ever adds time, so the fastest run of each kind so far is
    # compared, and so is each pair (its two runs close in time, under the same load, where the
    # fastest runs of each kind may come from a quiet and a busy moment); another pair is run
    # while both miss (a lane held back by its neighbours misses every time, by far).
    for _round in range(ROUNDS):
        runtime, client = await receivers(await new_store(), fast_sinks(tmp_path, consumer))
        alone = await fast_sinks_seconds(runtime, client, payloads, timeout=60)
        await runtime.close()

        chat, hang = await peer(), await peer(hang=True)
        runtime, client = await receivers(
            await new_store(), fast_sinks(tmp_path, consumer) + slow_sinks(chat, hang)
        )
        watched = time.monotonic()
        try:
            beside = await fast_sinks_seconds(
                runtime, client, payloads, timeout=max(15.0, 3 * MAX_RATIO * alone)
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc} (alone they took {alone:.1f} s)") from None
        watched = time.monotonic() - watched
        await runtime.close()  # before its store goes

        fastest["alone"] = min(alone, fastest.get("alone", alone))
        fastest["beside"] = min(beside, fastest.get("beside", beside))
        ratio = min(fastest["beside"] / fastest["alone"], beside / alone)
        ratios.append(f"{beside:.2f} s beside the slow sinks vs {alone:.2f} s alone")
        print(
            f"lanes: fast sinks {alone:.2f} s alone, {beside:.2f} s beside ({ratio:.2f}x); chat "
            f"at most {chat.most_in_window(WINDOW)} in {WINDOW:g} s at {CHAT_RATE:g}/s"
        )
        # The slow lanes were busy all along, at their own pace: the chat sink within its rate,
        # the hanging sink's attempts cut by its timeout.
        assert len(chat.times) >= 3, "the paced chat lane sent (almost) nothing"
        assert chat.most_in_window(WINDOW) <= allowed_in_window(CHAT_RATE, WINDOW), chat.times
        assert len(chat.times) <= allowed_in_window(CHAT_RATE, watched + 1.0)
        assert hang.times, "the hanging sink was never tried"
        if ratio <= MAX_RATIO:
            break
    else:
        raise AssertionError(f"more than {MAX_RATIO}x: " + "; ".join(ratios))
    assert len(consumer.requests) == WARM_UP + 2 * EVENTS * len(ratios)


async def test_two_replicas_on_one_postgres_hold_a_lane_to_its_rate_together(
    receivers: Any, upstream: Simulator, peer: Any
) -> None:
    require_postgres()
    # A window of 3 s allows 17 messages at 4/s; two replicas pacing on their own could send 32.
    rate, watch, window = 4.0, 6.0, 3.0
    chat = await peer()
    async with fresh_schema() as schema:
        store = {"url": POSTGRES_URL, "schema": schema, "pool_size": 4}
        sink = {**chat_sink(chat, rate), "concurrency": 2}
        replicas = [await receivers(store, [sink]) for _ in range(2)]
        payloads = [upstream.add_job("logo") for _ in range(80)]
        started = time.monotonic()
        # Half the events through each replica, as a load balancer spreads them.
        await asyncio.gather(
            *(send_all(client, payloads[n::2]) for n, (_runtime, client) in enumerate(replicas))
        )

        async def both_sent() -> bool:
            return all(delivered(runtime, "chat") >= 2 for runtime, _ in replicas)

        await wait_for(both_sent, 15, 0.05, "chat messages from both replicas")
        await asyncio.sleep(max(0.0, watch - (time.monotonic() - started)))
        elapsed = time.monotonic() - started
        sent = len(chat.times)
        by_replica = [delivered(runtime, "chat") for runtime, _ in replicas]
        for runtime, _client in replicas:
            await runtime.close()
    print(
        f"lanes: two replicas sent {by_replica} chat messages in {elapsed:.1f} s at {rate:g}/s, "
        f"at most {chat.most_in_window(window)} in {window:g} s"
    )
    # Each replica pacing on its own would send twice as many.
    assert chat.most_in_window(window) <= allowed_in_window(rate, window), chat.times
    assert sent <= allowed_in_window(rate, elapsed), (sent, elapsed)
