"""The simulator's side of pull mode over HTTP: collection pages, jobs that send no webhook,
long-poll accounting and 429 bursts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from receiver.simulator import Simulator
from receiver.simulator.sender import WebhookSender
from tests.support.helpers import free_port

API_KEY = "service_" + "4f" * 32
AUTH = {"Authorization": f"Bearer {API_KEY}"}
COLLECTION = "3f1c2a4e-5b6d-4e7f-8a9b-0c1d2e3f4a5b"


@pytest.fixture
def sim() -> Simulator:
    return Simulator(api_key=API_KEY, seed=41, shape="full")


@pytest.fixture
async def client(sim: Simulator) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(sim.create_app())) as client:
        yield client


async def get(client: TestClient[Any, Any], path: str) -> tuple[int, Any]:
    resp = await client.get(path, headers=AUTH)
    return resp.status, await resp.json()


async def test_collection_assets_come_in_pages_with_the_spec_pagination(sim, client) -> None:
    for _ in range(60):
        sim.add_job("image", collection_id=COLLECTION)  # 120 assets
    sim.add_job("logo")  # another collection

    status, first = await get(client, f"/v1/collections/{COLLECTION}/assets?limit=100")
    assert status == 200
    assert len(first["data"]) == 100
    assert first["meta"]["pagination"] == {
        "total": 120,
        "limit": 100,
        "offset": 0,
        "has_more": True,
    }
    _, second = await get(client, f"/v1/collections/{COLLECTION}/assets?limit=100&offset=100")
    assert len(second["data"]) == 20 and second["meta"]["pagination"]["has_more"] is False
    ids = [a["id"] for a in first["data"] + second["data"]]
    assert len(set(ids)) == 120
    asset = first["data"][0]
    assert asset["collection_id"] == COLLECTION and asset["status"] == "completed"
    assert asset["metadata"]["job_id"] in sim.jobs and asset["file_url"].startswith("http")

    _, default = await get(client, f"/v1/collections/{COLLECTION}/assets")
    assert default["meta"]["pagination"]["limit"] == 50
    _, bare = await get(client, f"/v1/collections/{COLLECTION}/assets?include_file_urls=false")
    assert "file_url" not in bare["data"][0]
    for query in ("limit=101", "limit=0", "offset=-1", "limit=x"):
        status, body = await get(client, f"/v1/collections/{COLLECTION}/assets?{query}")
        assert status == 400 and body["error"]["code"] == "validation_failed", query
    status, body = await get(client, "/v1/collections/7c0e1d2a-3b4c-4d5e-8f60-718293a4b5c6/assets")
    assert status == 404 and body["error"]["code"] == "not_found"


async def test_jobs_without_webhook_are_never_published(sim) -> None:
    sim.no_webhook_fraction = 0.5
    sim.add_webhook(f"http://127.0.0.1:{free_port()}/webhooks", secret="whsec_x")
    sender = WebhookSender(sim, time_scale=0.000001)
    await sender.start()
    try:
        payloads = [sim.add_job("logo") for _ in range(40)]
        published = [p for p in payloads if sender.publish(p)]
    finally:
        await sender.close()
    silent = [p for p in payloads if not sim.jobs[p["job_id"]].sends_webhook]
    assert 5 < len(silent) < 35  # about half
    assert {p["job_id"] for p in published} == {p["job_id"] for p in payloads} - {
        p["job_id"] for p in silent
    }
    assert sim.add_job("logo", webhook=True)["job_id"] in {
        j.id for j in sim.jobs.values() if j.sends_webhook
    }


async def test_long_polls_are_counted_per_job_with_their_overlap(sim, client) -> None:
    job_id = sim.add_job("logo", status="processing")["job_id"]
    path = f"/v1/jobs/{job_id}?wait=true&timeout=5"
    polls = [asyncio.create_task(get(client, path)) for _ in range(2)]
    await asyncio.sleep(0.3)
    assert sim.long_polls_in_flight[job_id] == 2
    sim.complete_job(job_id)
    for status, body in await asyncio.gather(*polls):
        assert status == 200 and body["data"]["status"] == "completed"
    assert sim.long_polls[job_id] == 2
    assert sim.max_long_polls_in_flight[job_id] == 2
    assert sim.long_polls_in_flight[job_id] == 0
    await get(client, f"/v1/jobs/{job_id}")  # not a long-poll
    assert sim.long_polls[job_id] == 2


async def test_a_429_burst_hits_its_route_only_then_ends(sim, client) -> None:
    job_id = sim.add_job("logo")["job_id"]
    sim.rate_limit_burst(2, retry_after=7, route="GET /v1/jobs/{id}")
    status, _ = await get(client, f"/v1/collections/{sim.jobs[job_id].collection_id}/assets")
    assert status == 200
    for _ in range(2):
        resp = await client.get(f"/v1/jobs/{job_id}", headers=AUTH)
        assert resp.status == 429 and resp.headers["Retry-After"] == "7"
    assert (await get(client, f"/v1/jobs/{job_id}"))[0] == 200


async def test_the_command_makes_jobs_without_webhook_and_names_them() -> None:
    from tests.support.cli import run_cli

    code, out, err = await run_cli(
        "simulate",
        "--port",
        str(free_port()),
        "--events",
        "2",
        "--kinds",
        "logo",
        "--no-webhook",
        "1",
        "--rate",
        "50",
        "--duration",
        "1",
    )
    assert code == 0, out + err
    assert "without webhook   2 jobs (found only by polling)" in out
    assert err.count("receiver watch ") == 2  # each job's id, ready to watch
