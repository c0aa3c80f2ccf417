"""The upstream simulator over HTTP: jobs, derived formats, long-poll and fault knobs.

Every kind of job, failed jobs, unknown ids and the bearer key, jobs pending for a while and
derived formats lagging behind, long polls (completion, timeout, server stop), and the fault
knobs (429, 5xx, latency) with their fractions deterministic per seed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from receiver.simulator import DERIVED_TYPES, KINDS, Simulator
from tests.support.simulator_cases import (
    API_KEY,
    AUTH,
    FakeClock,
    api,
    client,
    clock,
    fetch,
    sim,
)

__all__ = ["client", "clock", "sim"]  # fixtures, used by name


# ------------------------------------------------------------------ jobs


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_every_kind(client: TestClient[Any, Any], sim: Simulator, kind: str) -> None:
    payload = sim.add_job(kind, item_name="wave")
    assert payload["object"] == "event"
    assert payload["event"] == "job.completed"
    assert set(payload["asset_ids"]) == set(KINDS[kind].asset_types) == set(payload["urls"])

    job = (await api(client, f"/v1/jobs/{payload['job_id']}"))["data"]

    assert job["status"] == "completed"
    assert job["type"] == payload["type"] == KINDS[kind].job_type
    assert job["item_name"] == "wave"
    assert job["collection_id"] == payload["mascot_id"]
    assert job["cost_credits"] == KINDS[kind].cost_credits
    assert set(job["urls"]) == set(payload["asset_ids"])
    for key in ("created_at", "updated_at", "item_id"):
        assert job[key]


async def test_failed_job(client: TestClient[Any, Any], sim: Simulator) -> None:
    payload = sim.add_failed_job("animation", error="the provider timed out")
    assert payload["event"] == "job.failed"

    job = (await api(client, f"/v1/jobs/{payload['job_id']}"))["data"]

    assert job["status"] == "failed"
    assert job["error"] == "the provider timed out"
    assert job["urls"] == {}
    assert sim.add_job("failed")["event"] == "job.failed"


async def test_unknown_ids_are_404(client: TestClient[Any, Any]) -> None:
    body = await api(client, "/v1/jobs/nope", 404)
    assert body["error"]["code"] == "not_found"
    body = await api(client, "/v1/assets/nope", 404)
    assert body["error"]["code"] == "not_found"
    body = await api(client, "/v1/credits-or-whatever", 404)
    assert body["error"]["code"] == "not_found"


async def test_bearer_key_is_checked(client: TestClient[Any, Any], sim: Simulator) -> None:
    job_id = sim.add_job("image")["job_id"]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {API_KEY}"}):
        resp = await client.get(f"/v1/jobs/{job_id}", headers=headers)
        assert resp.status == 401
        assert (await resp.json())["error"]["code"] == "unauthorized"
    assert sim.requests["GET /v1/jobs/{id}"] == 3


async def test_job_pending_for_seconds(
    client: TestClient[Any, Any], sim: Simulator, clock: FakeClock
) -> None:
    sim.job_pending_for_seconds = 30
    payload = sim.add_job("image")
    job_path = f"/v1/jobs/{payload['job_id']}"

    job = (await api(client, job_path))["data"]
    assert job["status"] == "processing"
    assert job["urls"] == {}
    asset = (await api(client, f"/v1/assets/{payload['asset_ids']['image']}"))["data"]
    assert asset["status"] == "processing"
    assert (await fetch(client, asset["file_url"]))[0] == 404

    clock.advance(31)
    assert (await api(client, job_path))["data"]["status"] == "completed"
    assert (await fetch(client, asset["file_url"]))[0] == 200


async def test_derived_formats_lag_behind(
    client: TestClient[Any, Any], sim: Simulator, clock: FakeClock
) -> None:
    sim.derived_delay_seconds = 60
    payload = sim.add_job("animation")

    assert (await api(client, f"/v1/jobs/{payload['job_id']}"))["data"]["status"] == "completed"
    urls = {}
    for asset_type, asset_id in payload["asset_ids"].items():
        asset = (await api(client, f"/v1/assets/{asset_id}"))["data"]
        urls[asset_type] = asset["file_url"]
        derived = asset_type in DERIVED_TYPES
        assert asset["status"] == ("processing" if derived else "completed"), asset_type
        assert (await fetch(client, asset["file_url"]))[0] == (404 if derived else 200)

    clock.advance(61)
    for asset_type, asset_id in payload["asset_ids"].items():
        assert (await api(client, f"/v1/assets/{asset_id}"))["data"]["status"] == "completed"
        # The URL handed out before the file existed works once it does.
        assert (await fetch(client, urls[asset_type]))[0] == 200


async def test_derived_formats_missing_until_they_finish(
    client: TestClient[Any, Any], sim: Simulator, clock: FakeClock
) -> None:
    """``derived_missing``: a derived asset the webhook names does not exist until it is done."""
    sim.derived_delay_seconds, sim.derived_missing = 60, True
    payload = sim.add_job("animation")
    derived = {t: a for t, a in payload["asset_ids"].items() if t in DERIVED_TYPES}
    assert derived and len(derived) < len(payload["asset_ids"])

    for asset_type, asset_id in payload["asset_ids"].items():
        status = 404 if asset_type in derived else 200
        body = await api(client, f"/v1/assets/{asset_id}", status)
        assert (body["error"]["code"] if status == 404 else body["data"]["status"]) == (
            "not_found" if status == 404 else "completed"
        ), asset_type

    clock.advance(61)
    for asset_id in derived.values():
        assert (await api(client, f"/v1/assets/{asset_id}"))["data"]["status"] == "completed"


# ------------------------------------------------------------------ long-poll


async def test_long_poll_returns_when_the_job_completes(
    client: TestClient[Any, Any], sim: Simulator
) -> None:
    job_id = sim.add_job("animation", status="processing")["job_id"]
    asyncio.get_running_loop().call_later(0.2, sim.complete_job, job_id)

    started = time.monotonic()
    job = (await api(client, f"/v1/jobs/{job_id}?wait=true&timeout=10"))["data"]

    assert job["status"] == "completed"
    assert 0.15 <= time.monotonic() - started < 5


async def test_long_poll_returns_the_current_state_at_the_timeout(
    client: TestClient[Any, Any], sim: Simulator
) -> None:
    job_id = sim.add_job("image", status="processing")["job_id"]
    started = time.monotonic()
    job = (await api(client, f"/v1/jobs/{job_id}?wait=true&timeout=0.2"))["data"]
    assert job["status"] == "processing"
    assert time.monotonic() - started >= 0.19

    sim.fail_job(job_id, "out of credits")
    job = (await api(client, f"/v1/jobs/{job_id}?wait=true&timeout=10"))["data"]
    assert (job["status"], job["error"]) == ("failed", "out of credits")

    body = await api(client, f"/v1/jobs/{job_id}?wait=true&timeout=soon", 400)
    assert body["error"]["code"] == "validation_failed"


async def test_long_poll_ends_when_the_server_stops(sim: Simulator) -> None:
    job_id = sim.add_job("image", status="processing")["job_id"]
    started = time.monotonic()
    async with TestClient(TestServer(sim.create_app())) as client:
        request = asyncio.ensure_future(
            client.get(f"/v1/jobs/{job_id}?wait=true&timeout=100", headers=AUTH)
        )
        await asyncio.sleep(0.1)
        await client.server.close()
        try:
            resp = await request
            resp.release()
        except Exception:
            pass
    assert time.monotonic() - started < 5


# ------------------------------------------------------------------ faults


async def test_fault_knobs(client: TestClient[Any, Any], sim: Simulator) -> None:
    job_id = sim.add_job("image")["job_id"]
    sim.rate_limit_fraction = 1.0
    sim.retry_after = 12
    resp = await client.get(f"/v1/jobs/{job_id}", headers=AUTH)
    assert resp.status == 429
    assert resp.headers["Retry-After"] == "12"
    assert (await resp.json())["error"]["code"] == "rate_limited"

    sim.rate_limit_fraction = 0.0
    sim.error_fraction = 1.0
    sim.error_status = 503
    resp = await client.get(f"/v1/jobs/{job_id}", headers=AUTH)
    assert resp.status == 503
    body = await resp.json()
    assert body["error"]["code"] == "upstream_error"
    assert body["error"]["request_id"] == resp.headers["Request-Id"]

    sim.error_fraction = 0.0
    sim.latency_seconds = 0.2
    started = time.monotonic()
    await api(client, f"/v1/jobs/{job_id}")
    assert time.monotonic() - started >= 0.19
    assert sim.requests["GET /v1/jobs/{id}"] == 3


async def test_fractions_are_deterministic_per_seed() -> None:
    def outcomes(seed: int) -> list[bool]:
        sim = Simulator(seed=seed)
        sim.rate_limit_fraction = 0.3
        return [sim._roll(sim.rate_limit_fraction) for _ in range(50)]

    assert outcomes(1) == outcomes(1)
    assert 5 <= sum(outcomes(1)) <= 25
