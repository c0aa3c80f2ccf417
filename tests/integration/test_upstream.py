"""The upstream client against the real simulator (and a scripted server for odd answers)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestServer

from receiver.errors import (
    DeliveryError,
    PermanentError,
    TransientError,
    UpstreamAuthError,
)
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


# ------------------------------------------------------------------ success


async def test_get_job(client: UpstreamClient, sim: Simulator, metrics: Metrics) -> None:
    payload = sim.add_job("image")

    job = await client.get_job(payload["job_id"])

    assert job["id"] == payload["job_id"]
    assert job["status"] == "completed"
    assert job["type"] == "image_generation"
    assert set(job["urls"]) == {"image", "transparent_image"}
    assert sim.requests["GET /v1/jobs/{id}"] == 1
    assert count(metrics, "/jobs/{id}", "200") == 1
    assert observed(metrics, "/jobs/{id}") == 1


async def test_get_asset_and_its_file(
    client: UpstreamClient,
    sim: Simulator,
    session: aiohttp.ClientSession,
    server: TestServer,
    metrics: Metrics,
) -> None:
    payload = sim.add_job("animation")
    asset_id = sim.jobs[payload["job_id"]].asset_ids["webm"]

    asset = await client.get_asset(asset_id)

    assert asset["id"] == asset_id
    assert asset["type"] == "webm"
    assert asset["status"] == "completed"
    assert asset["file_url"].startswith(str(server.make_url("/files/")))
    async with session.get(asset["file_url"]) as resp:
        assert resp.status == 200
        assert resp.content_type == "video/webm"
    assert count(metrics, "/assets/{id}", "200") == 1


async def test_long_poll_until_the_job_completes(client: UpstreamClient, sim: Simulator) -> None:
    job_id = sim.add_job("logo", status="processing")["job_id"]
    asyncio.get_running_loop().call_later(0.1, sim.complete_job, job_id)

    started = time.monotonic()
    job = await client.get_job(job_id, wait_seconds=5)

    assert job["status"] == "completed"
    assert time.monotonic() - started < 3


async def test_request_headers_and_quoted_ids(session: aiohttp.ClientSession) -> None:
    seen: list[tuple[str, str | None, str | None]] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(
            (request.raw_path, request.headers.get("Authorization"), request.headers.get("Accept"))
        )
        return web.json_response({"data": {"id": "x"}})

    async with scripted_server(handler) as base_url:
        client = UpstreamClient(session=session, base_url=base_url, api_key=API_KEY, timeout=5)
        await client.get_job("a/b c?d")
        await client.get_asset("é#1")

    assert seen == [
        ("/v1/jobs/a%2Fb%20c%3Fd", f"Bearer {API_KEY}", "application/json"),
        ("/v1/assets/%C3%A9%231", f"Bearer {API_KEY}", "application/json"),
    ]


@pytest.mark.parametrize("bad_id", ["", ".", ".."])
async def test_ids_that_would_address_another_resource_are_refused(
    client: UpstreamClient, sim: Simulator, bad_id: str
) -> None:
    with pytest.raises(PermanentError):
        await client.get_job(bad_id)
    assert sum(sim.requests.values()) == 0


# ------------------------------------------------------------------ 429 and 5xx


async def test_429_with_retry_after_seconds(
    client: UpstreamClient, sim: Simulator, metrics: Metrics
) -> None:
    job_id = sim.add_job("image")["job_id"]
    sim.rate_limit_fraction = 1.0
    sim.retry_after = 7

    with pytest.raises(TransientError) as info:
        await client.get_job(job_id)

    assert type(info.value) is TransientError
    assert info.value.retry_after == 7
    assert "429" in str(info.value) and "rate_limited" in str(info.value)
    assert count(metrics, "/jobs/{id}", "429") == 1


async def test_429_with_retry_after_http_date(client: UpstreamClient, sim: Simulator) -> None:
    job_id = sim.add_job("image")["job_id"]
    sim.rate_limit_fraction = 1.0
    sim.retry_after = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)

    with pytest.raises(TransientError) as info:
        await client.get_job(job_id)

    assert info.value.retry_after is not None
    assert 25 <= info.value.retry_after <= 31


async def test_429_with_a_past_http_date_waits_zero(client: UpstreamClient, sim: Simulator) -> None:
    job_id = sim.add_job("image")["job_id"]
    sim.rate_limit_fraction = 1.0
    sim.retry_after = "Wed, 21 Oct 2015 07:28:00 GMT"

    with pytest.raises(TransientError) as info:
        await client.get_job(job_id)

    assert info.value.retry_after == 0


async def test_429_without_retry_after(client: UpstreamClient, sim: Simulator) -> None:
    job_id = sim.add_job("image")["job_id"]
    sim.rate_limit_fraction = 1.0

    with pytest.raises(TransientError) as info:
        await client.get_job(job_id)

    assert info.value.retry_after is None


@pytest.mark.parametrize(
    ("status", "code"), [(500, "internal"), (502, "upstream_error"), (503, "upstream_error")]
)
async def test_5xx_is_transient(
    client: UpstreamClient, sim: Simulator, metrics: Metrics, status: int, code: str
) -> None:
    asset_id = sim.jobs[sim.add_job("scene")["job_id"]].asset_ids["scene"]
    sim.error_fraction = 1.0
    sim.error_status = status

    with pytest.raises(TransientError) as info:
        await client.get_asset(asset_id)

    assert type(info.value) is TransientError
    assert str(status) in str(info.value) and code in str(info.value)
    assert count(metrics, "/assets/{id}", str(status)) == 1


async def test_some_rate_limited_calls_then_success(client: UpstreamClient, sim: Simulator) -> None:
    job_id = sim.add_job("image")["job_id"]
    sim.rate_limit_fraction = 0.5
    outcomes = []
    for _ in range(20):
        try:
            await client.get_job(job_id)
            outcomes.append("ok")
        except TransientError:
            outcomes.append("429")
    assert "ok" in outcomes and "429" in outcomes


# ------------------------------------------------------------------ network failures


async def test_timeout(
    sim: Simulator, server: TestServer, session: aiohttp.ClientSession, metrics: Metrics
) -> None:
    job_id = sim.add_job("image")["job_id"]
    sim.latency_seconds = 2.0
    client = UpstreamClient(
        session=session,
        base_url=str(server.make_url("/v1")),
        api_key=API_KEY,
        timeout=0.2,
        metrics=metrics,
    )

    started = time.monotonic()
    with pytest.raises(TransientError) as info:
        await client.get_job(job_id)

    assert time.monotonic() - started < 1.5
    assert "within 0.2s" in str(info.value)
    assert isinstance(info.value.__cause__, TimeoutError)
    assert count(metrics, "/jobs/{id}", "timeout") == 1
    assert observed(metrics, "/jobs/{id}") == 1


async def test_connection_refused(session: aiohttp.ClientSession, metrics: Metrics) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = UpstreamClient(
        session=session,
        base_url=f"http://127.0.0.1:{port}/v1",
        api_key=API_KEY,
        timeout=5,
        metrics=metrics,
    )

    with pytest.raises(TransientError) as info:
        await client.get_asset("0b7c1e62-3f2a-4c4e-9d55-5d1f0a7c9e10")

    assert isinstance(info.value.__cause__, aiohttp.ClientError)
    assert count(metrics, "/assets/{id}", "error") == 1


async def test_closed_session_is_transient() -> None:
    session = aiohttp.ClientSession()
    await session.close()
    client = UpstreamClient(
        session=session, base_url="http://127.0.0.1:9/v1", api_key=API_KEY, timeout=1
    )
    with pytest.raises(TransientError):
        await client.get_job("x")


# ------------------------------------------------------------------ 4xx


async def test_wrong_key_is_an_auth_error_logged_once(
    server: TestServer, session: aiohttp.ClientSession, sim: Simulator, metrics: Metrics
) -> None:
    job_id = sim.add_job("image")["job_id"]
    wrong_key = "service_" + "cd" * 32
    client = UpstreamClient(
        session=session,
        base_url=str(server.make_url("/v1")),
        api_key=wrong_key,
        timeout=5,
        metrics=metrics,
    )

    with structlog.testing.capture_logs() as logs, pytest.raises(UpstreamAuthError) as info:
        await client.get_job(job_id)

    assert isinstance(info.value, TransientError)
    assert "401" in str(info.value) and "unauthorized" in str(info.value)
    refused = [entry for entry in logs if entry["event"] == "upstream refused the API key"]
    assert len(refused) == 1
    assert refused[0]["log_level"] == "error"
    assert refused[0]["status"] == 401
    assert wrong_key not in repr(logs)
    assert wrong_key not in str(info.value)
    assert count(metrics, "/jobs/{id}", "401") == 1


async def test_unknown_job_is_permanent(client: UpstreamClient, metrics: Metrics) -> None:
    job_id = "9f1e2d3c-4b5a-4968-8776-655443322110"
    with pytest.raises(PermanentError) as info:
        await client.get_job(job_id)
    assert str(info.value) == f"job {job_id} not found upstream"
    assert count(metrics, "/jobs/{id}", "404") == 1


async def test_unknown_asset_is_permanent(client: UpstreamClient) -> None:
    with pytest.raises(PermanentError, match="asset nope not found upstream"):
        await client.get_asset("nope")


async def test_invalid_json_is_transient(
    client: UpstreamClient, sim: Simulator, metrics: Metrics
) -> None:
    job_id = sim.add_job("image")["job_id"]
    sim.invalid_json_fraction = 1.0
    with pytest.raises(TransientError, match="not JSON"):
        await client.get_job(job_id)
    assert count(metrics, "/jobs/{id}", "200") == 1


@pytest.mark.parametrize(
    ("status", "body", "expected", "fragment"),
    [
        (200, {"result": {}}, TransientError, "without data"),
        (200, {"data": None}, TransientError, "without data"),
        (200, {"data": [1, 2]}, TransientError, "not an object"),
        (
            403,
            {"error": {"code": "forbidden", "message": "read-only key"}},
            UpstreamAuthError,
            "403 forbidden",
        ),
        (
            422,
            {"error": {"code": "invalid_graph", "message": "bad"}},
            PermanentError,
            "422 invalid_graph",
        ),
        (
            400,
            {"error": {"code": "validation_failed", "message": "no"}},
            PermanentError,
            "400 validation_failed",
        ),
        (410, b"gone", PermanentError, "410"),
        (409, {"error": {"code": "conflict", "message": "busy"}}, TransientError, "409 conflict"),
        (504, b"<html>gateway</html>", TransientError, "504"),
        (302, b"", TransientError, "302"),
    ],
)
async def test_odd_answers(
    session: aiohttp.ClientSession,
    metrics: Metrics,
    status: int,
    body: Any,
    expected: type[DeliveryError],
    fragment: str,
) -> None:
    async def handler(request: web.Request) -> web.Response:
        headers = {"Location": "https://elsewhere.invalid/"} if status == 302 else None
        if isinstance(body, bytes):
            return web.Response(status=status, body=body, headers=headers)
        return web.json_response(body, status=status, headers=headers)

    async with scripted_server(handler) as base_url:
        client = UpstreamClient(
            session=session, base_url=base_url, api_key=API_KEY, timeout=5, metrics=metrics
        )
        with pytest.raises(expected) as info:
            await client.get_job("j1")

    assert type(info.value) is expected
    assert fragment in str(info.value)
    assert count(metrics, "/jobs/{id}", str(status)) == 1


async def test_the_key_never_reaches_logs_or_messages(
    session: aiohttp.ClientSession, sim: Simulator, server: TestServer
) -> None:
    async def echo_key(request: web.Request) -> web.Response:
        message = f"key {request.headers.get('Authorization', '')} is revoked"
        return web.json_response({"error": {"code": "forbidden", "message": message}}, status=403)

    sim.add_job("image")
    messages: list[str] = []
    with structlog.testing.capture_logs() as logs:
        async with scripted_server(echo_key) as base_url:
            client = UpstreamClient(session=session, base_url=base_url, api_key=API_KEY, timeout=5)
            with pytest.raises(UpstreamAuthError) as info:
                await client.get_job("j1")
            messages.append(str(info.value))
        real = UpstreamClient(
            session=session, base_url=str(server.make_url("/v1")), api_key=API_KEY, timeout=0.2
        )
        sim.error_fraction = 1.0
        for call in (real.get_job("missing"), real.get_asset("missing")):
            with pytest.raises(DeliveryError) as failed:
                await call
            messages.append(str(failed.value))
        sim.error_fraction = 0.0
        sim.latency_seconds = 1.0
        with pytest.raises(TransientError) as timed_out:
            await real.get_job("missing")
        messages.append(str(timed_out.value))

    assert logs, "the auth failure is logged"
    assert API_KEY not in repr(logs)
    assert all(API_KEY not in message for message in messages)
    assert "<redacted>" in messages[0]


# ------------------------------------------------------------------ webhooks


async def test_webhook_crud(client: UpstreamClient, sim: Simulator, metrics: Metrics) -> None:
    created = await client.create_webhook("https://hooks.example.com/receiver", ["job.completed"])
    assert created["secret"].startswith("whsec_")
    assert created["events"] == ["job.completed"]

    everything = await client.create_webhook("http://127.0.0.1:8080/webhooks", None)
    assert everything["events"] == ["job.completed", "job.failed"]

    listed = await client.list_webhooks()
    assert [hook["id"] for hook in listed] == [created["id"], everything["id"]]
    assert all("secret" not in hook for hook in listed)

    await client.delete_webhook(created["id"])
    assert [hook["id"] for hook in await client.list_webhooks()] == [everything["id"]]
    with pytest.raises(PermanentError, match="not found upstream"):
        await client.delete_webhook(created["id"])
    with pytest.raises(PermanentError, match="400 validation_failed"):
        await client.create_webhook("http://hooks.example.com/plain-http", None)

    assert count(metrics, "/webhooks", "201") == 2
    assert count(metrics, "/webhooks", "200") == 2
    assert count(metrics, "/webhooks", "400") == 1
    assert count(metrics, "/webhooks/{id}", "204") == 1
    assert count(metrics, "/webhooks/{id}", "404") == 1


# ------------------------------------------------------------------ helpers


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
