"""The upstream client against the real simulator (and a scripted server): calls that succeed.

Jobs, assets and their files fetched, a long poll until the job completes, the request headers
and quoted ids (ids that would address another resource refused), and the webhook endpoints.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from receiver.errors import (
    PermanentError,
)
from receiver.observe.metrics import Metrics
from receiver.simulator import Simulator
from receiver.upstream.client import UpstreamClient
from tests.support.upstream_client_cases import (
    API_KEY,
    client,
    count,
    metrics,
    observed,
    scripted_server,
    server,
    session,
    sim,
)

__all__ = ["client", "metrics", "server", "session", "sim"]  # fixtures, used by name


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
