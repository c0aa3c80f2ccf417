"""The simulator's version switches: its OpenAPI document and drift, the Service-API-Version
check, Deprecation and Sunset on the job endpoint, unknown job statuses; and the receiver
against them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from email.utils import parsedate_to_datetime
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from receiver.app import Runtime
from receiver.cli import build_parser
from receiver.config.load import parse_settings
from receiver.simulator import Simulator
from receiver.simulator.cli import options_from_args
from receiver.simulator.run import SimulateOptions, Simulation
from receiver.simulator.versions import (
    JOBS_DEPRECATED_AT,
    KNOWN_API_VERSIONS,
    VersionFaults,
    baseline_document,
)
from tests.support.helpers import wait_for
from tests.support.pull import (
    API_KEY,
    idle,
    metric,
    receiver_config,
    send_webhook,
    serve_simulator,
)

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PINNED = {**AUTH, "Service-API-Version": "2026-08-20"}
NOW = 1_800_000_000.0


@pytest.fixture
def sim() -> Simulator:
    return Simulator(api_key=API_KEY, seed=5, now=lambda: NOW, shape="full")


@pytest.fixture
async def client(sim: Simulator) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(sim.create_app())) as client:
        yield client


def job_schema(document: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = document["components"]["schemas"]["Job"]
    return schema


# -- the document -------------------------------------------------------------------------------


async def test_the_document_is_public_and_is_the_baseline_without_drift(client, sim):
    sim.api_versions = frozenset(KNOWN_API_VERSIONS)
    response = await client.get("/v1/openapi.json")  # no key, no version
    assert response.status == 200
    assert await response.json() == baseline_document()


async def test_notice_drift_is_a_new_revision_deprecating_the_job_operation(client, sim):
    sim.spec_drift = "notice"
    document = await (await client.get("/v1/openapi.json")).json()
    baseline = baseline_document()
    assert document["info"]["version"] != baseline["info"]["version"]
    assert document["paths"]["/v1/jobs/{id}"]["get"]["deprecated"] is True
    assert job_schema(document) == job_schema(baseline)


async def test_breaking_drift_adds_a_job_status_and_removes_a_field(client, sim):
    sim.spec_drift = "breaking"
    document = await (await client.get("/v1/openapi.json")).json()
    job = job_schema(document)
    assert job["properties"]["status"]["enum"] == [
        "pending",
        "processing",
        "completed",
        "failed",
        "queued",
    ]
    assert (
        "item_name" not in job["properties"]
        and "item_name" in job_schema(baseline_document())["properties"]
    )
    assert document["paths"]["/v1/jobs/{id}"]["get"]["deprecated"] is True
    # Switched back, the baseline again (each answer is made afresh).
    sim.spec_drift = "none"
    assert await (await client.get("/v1/openapi.json")).json() == baseline_document()


# -- the version header -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "named"),
    [(None, "Service-API-Version header is required"), ("2027-01-01", "2027-01-01")],
)
async def test_a_missing_or_unknown_version_is_refused_naming_it(client, sim, header, named):
    sim.api_versions = frozenset({"2026-05-23", "2026-08-20"})
    job_id = sim.add_job()["job_id"]
    headers = dict(AUTH) if header is None else {**AUTH, "Service-API-Version": header}
    response = await client.get(f"/v1/jobs/{job_id}", headers=headers)
    assert response.status == 400
    error = (await response.json())["error"]
    assert (error["code"], error["param"]) == ("validation_failed", "Service-API-Version")
    assert named in error["message"] and "2026-05-23, 2026-08-20" in error["message"]
    assert error["request_id"] == response.headers["Request-Id"]

    accepted = await client.get(f"/v1/jobs/{job_id}", headers=PINNED)
    assert accepted.status == 200


async def test_without_accepted_versions_nothing_is_checked(client, sim):
    job_id = sim.add_job()["job_id"]
    assert (await client.get(f"/v1/jobs/{job_id}", headers=AUTH)).status == 200


# -- Deprecation, Sunset, unknown statuses ------------------------------------------------------


async def test_the_job_endpoint_carries_deprecation_and_sunset(client, sim):
    payload = sim.add_job()
    VersionFaults(deprecate_jobs=True, sunset_days=30).apply(sim)
    job = await client.get(f"/v1/jobs/{payload['job_id']}", headers=PINNED)
    assert job.headers["Deprecation"] == f"@{JOBS_DEPRECATED_AT}"
    sunset = parsedate_to_datetime(job.headers["Sunset"]).timestamp()
    assert sunset == NOW + 30 * 86400
    assert 'rel="deprecation"' in job.headers["Link"] and 'rel="sunset"' in job.headers["Link"]
    missing = await client.get("/v1/jobs/4e0f2a9c-0000-4000-8000-000000000000", headers=PINNED)
    assert missing.status == 404 and "Deprecation" in missing.headers
    (asset_id, *_) = payload["asset_ids"].values()
    asset = await client.get(f"/v1/assets/{asset_id}", headers=PINNED)
    assert asset.status == 200 and "Deprecation" not in asset.headers
    assert "Sunset" not in asset.headers


async def test_some_jobs_report_a_status_outside_the_spec(client, sim):
    chosen = sim.add_job()["job_id"]
    other = sim.add_job()["job_id"]
    sim.unknown_status_jobs = frozenset({chosen})
    statuses = {}
    for job_id in (chosen, other):
        body = await (await client.get(f"/v1/jobs/{job_id}", headers=PINNED)).json()
        statuses[job_id] = (body["data"]["status"], bool(body["data"]["urls"]))
    assert statuses == {chosen: ("queued", False), other: ("completed", True)}

    sim.unknown_status_jobs = frozenset()
    sim.unknown_status_fraction = 0.5
    many = [sim.add_job()["job_id"] for _ in range(200)]
    unknown = [j for j in many if sim.job_json(j)["status"] == "queued"]
    assert 60 < len(unknown) < 140
    assert [sim.job_json(j)["status"] for j in unknown] == ["queued"] * len(unknown)  # for good


# -- the flags ----------------------------------------------------------------------------------


def simulate_args(*args: str) -> Any:
    return build_parser().parse_args(["simulate", *args])


def test_the_flags_become_the_switches():
    assert options_from_args(simulate_args()).versions == VersionFaults(
        api_versions=KNOWN_API_VERSIONS
    )
    given = simulate_args(
        "--api-versions",
        "2026-05-23, 2026-08-20",
        "--spec-drift",
        "breaking",
        "--deprecate-jobs",
        "--sunset-days",
        "45",
        "--unknown-status",
        "0.25",
    )
    assert options_from_args(given).versions == VersionFaults(
        api_versions=("2026-05-23", "2026-08-20"),
        spec_drift="breaking",
        deprecate_jobs=True,
        sunset_days=45.0,
        unknown_status_fraction=0.25,
    )
    assert options_from_args(simulate_args("--api-versions", "any")).versions.api_versions is None


@pytest.mark.parametrize(
    ("faults", "flag"),
    [
        (VersionFaults(api_versions=("tomorrow",)), "--api-versions"),
        (VersionFaults(api_versions=()), "--api-versions"),
        (VersionFaults(spec_drift="sideways"), "--spec-drift"),
        (VersionFaults(sunset_days=-1), "--sunset-days"),
        (VersionFaults(unknown_status_fraction=2), "--unknown-status"),
    ],
)
def test_bad_switches_are_refused_naming_the_flag(faults, flag):
    problems = SimulateOptions(versions=faults).problems()
    assert len(problems) == 1 and problems[0].startswith(flag)
    with pytest.raises(ValueError, match=flag):
        Simulation(SimulateOptions(versions=faults))


# -- the receiver against them ------------------------------------------------------------------


async def test_the_receiver_against_a_simulator_refusing_its_version(
    aiohttp_server, aiohttp_client, tmp_path
):
    """A version the simulator does not accept: /readyz says so and the event waits; once the
    simulator accepts it, the event is delivered and /readyz is ready."""
    sim = await serve_simulator(aiohttp_server, seed=9, shape="full")
    VersionFaults(api_versions=("2026-05-23",), deprecate_jobs=True, sunset_days=10).apply(sim)
    config = receiver_config(tmp_path, sim, api={"base_url": sim.base_url, "api_key": API_KEY})
    runtime = Runtime(parse_settings(config, env={}))
    async with runtime:
        public = await aiohttp_client(runtime.public_app())
        ops = await aiohttp_client(runtime.ops_app())
        payload = sim.add_job("logo")
        await send_webhook(public, payload)

        async def refused() -> bool:
            return (await ops.get("/readyz")).status == 503

        await wait_for(refused, 15, what="/readyz refusing")
        reasons = (await (await ops.get("/readyz")).json())["reasons"]
        assert any("pinned API version 2026-08-20" in r for r in reasons)
        assert (await runtime.store.get(payload["id"])).state == "pending"

        sim.api_versions = frozenset({"2026-05-23", "2026-08-20"})
        runtime.wake_worker()
        await idle(runtime)
        assert (await runtime.store.get(payload["id"])).state == "done"
        assert (await ops.get("/readyz")).status == 200
        endpoint = {"endpoint": "/jobs/{id}"}
        assert metric(runtime, "receiver_upstream_deprecated_total", endpoint) >= 1
        assert metric(runtime, "receiver_upstream_sunset_timestamp_seconds", endpoint) == (
            sim.jobs_sunset_at
        )
