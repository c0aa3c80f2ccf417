"""The upstream client against the real simulator (and a scripted server for odd answers): 4xx.

A wrong key (an auth error, logged once), unknown jobs and assets, invalid JSON, odd statuses
and bodies each mapped to their error, and the key never reaching logs or messages.
"""

from __future__ import annotations

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
from tests.support.upstream_client_cases import (
    API_KEY,
    client,
    count,
    metrics,
    scripted_server,
    server,
    session,
    sim,
)

__all__ = ["client", "metrics", "server", "session", "sim"]  # fixtures, used by name


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
