"""The whole path in one process: webhook -> inbox -> worker -> simulator upstream -> files."""

import time
from functools import partial
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from receiver import __version__
from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.store.schema_version import SCHEMA_VERSION
from tests.support.expect import expected_files
from tests.support.helpers import wait_for
from tests.support.pipeline import download_settings, settled
from tests.support.pipeline import send as send_signed
from tests.support.store_cases import redeliver
from tests.support.upstream import rely_on, serve_upstream

SECRET = "whsec_pipeline"
API_KEY = "service_" + "ab" * 32
CRASH_EVENTS = {
    "event processing crashed",
    "unexpected sink error",
    "unexpected error while fetching the job",
}


@pytest.fixture
async def upstream(aiohttp_server):
    return await serve_upstream(aiohttp_server, api_key=API_KEY, seed=3)


def make_settings(tmp_path, upstream, **worker):
    return download_settings(
        upstream,
        tmp_path,
        secret=SECRET,
        api_key=API_KEY,
        worker=worker,
    )


send = partial(send_signed, secret=SECRET)


@pytest.fixture
async def pipeline(aiohttp_client, tmp_path, upstream):
    runtime = Runtime(make_settings(tmp_path, upstream))
    with capture_logs() as logs:
        async with runtime:
            client = await aiohttp_client(runtime.public_app())
            yield runtime, client, upstream, tmp_path / "dl"
    crashes = [line for line in logs if line["event"] in CRASH_EVENTS]
    assert not crashes, crashes


def files_under(root: Path):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def metric(runtime, name, labels=None):
    return runtime.metrics.registry.get_sample_value(name, labels or {}) or 0.0


async def test_image_job_files_land_at_the_contract_path(pipeline):
    runtime, client, sim, dl = pipeline
    # The path of a file named by the webhook's asset ids, in a job with its item name.
    rely_on(sim, event=["asset_ids"], job=["item_name", "collection_id"])
    payload = sim.add_job("image", item_name="happy wave")
    await send(client, payload)
    record = await settled(runtime, payload["id"])
    job = sim.jobs[payload["job_id"]]
    expected = sorted(
        f"{job.collection_id}/happy wave/{kind}-{asset_id}.png"
        for kind, asset_id in payload["asset_ids"].items()
    )
    assert files_under(dl) == expected
    for path in dl.rglob("*.png"):
        assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert record.deliveries[0].attempts == 1
    assert (
        metric(runtime, "receiver_events_total", {"event": "job.completed", "outcome": "processed"})
        == 1
    )
    assert (
        metric(runtime, "receiver_sink_deliveries_total", {"sink": "files", "outcome": "success"})
        == 1
    )
    assert metric(runtime, "receiver_event_lag_seconds_count") == 1
    assert (
        metric(
            runtime, "receiver_upstream_requests_total", {"endpoint": "/jobs/{id}", "status": "200"}
        )
        == 1
    )


async def test_webhook_urls_are_never_downloaded(pipeline):
    runtime, client, sim, dl = pipeline
    rely_on(sim, event=["asset_ids", "urls"])
    payload = sim.add_job("logo")
    payload["urls"] = {k: "http://169.254.169.254/latest/meta-data" for k in payload["urls"]}
    await send(client, payload)
    await settled(runtime, payload["id"])
    assert sim.requests["GET /v1/assets/{id}"] == len(payload["asset_ids"])
    assert len(files_under(dl)) == len(payload["asset_ids"])


@pytest.mark.parametrize("missing", [False, True], ids=["processing", "not there yet"])
async def test_derived_formats_arriving_late_are_retried_not_skipped(pipeline, missing):
    """Derived formats finish after their job: still ``processing``, or (the spec: "a completed
    parent does not guarantee every derived asset exists") answering 404 until they exist."""
    runtime, client, sim, dl = pipeline
    sim.derived_delay_seconds, sim.derived_missing = 0.6, missing
    rely_on(sim, event=["asset_ids"])
    payload = sim.add_job("animation", item_name="dance")
    await send(client, payload)
    record = await settled(runtime, payload["id"])
    assert record.deliveries[0].attempts > 1
    assert (sim.responses["GET /v1/assets/{id}", 404] > 0) is missing
    kinds = sorted(name.split("/")[-1].split("-")[0] for name in files_under(dl))
    assert kinds == sorted(payload["asset_ids"])
    assert {Path(n).suffix for n in files_under(dl)} >= {".mp4", ".webm"}


async def test_job_still_processing_is_retried(pipeline):
    runtime, client, sim, dl = pipeline
    sim.job_pending_for_seconds = 0.4
    payload = sim.add_job("image")
    await send(client, payload)
    record = await settled(runtime, payload["id"])
    assert record.deliveries[0].attempts > 1
    assert set(files_under(dl)) == expected_files(sim, [payload])


@pytest.mark.parametrize("fault", ["rate_limit", "errors"])
async def test_upstream_storms_end_in_delivery(pipeline, fault):
    runtime, client, sim, dl = pipeline
    if fault == "rate_limit":
        sim.rate_limit_fraction, sim.retry_after = 0.4, 0
    else:
        sim.error_fraction = 0.4
    payloads = [sim.add_job("image") for _ in range(5)]
    for payload in payloads:
        await send(client, payload)
    for payload in payloads:
        await settled(runtime, payload["id"], timeout=30)
    assert set(files_under(dl)) == expected_files(sim, payloads)
    assert files_under(dl)
    refused = "429" if fault == "rate_limit" else "500"
    statuses = {labels["status"] for labels in _upstream_labels(runtime)}
    assert refused in statuses


def _upstream_labels(runtime):
    for family in runtime.metrics.registry.collect():
        if family.name == "receiver_upstream_requests":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.value:
                    yield sample.labels


async def test_unknown_job_is_dead_then_redeliverable(pipeline, aiohttp_client):
    runtime, client, sim, dl = pipeline
    payload = sim.add_job("image")
    job = sim.jobs.pop(payload["job_id"])
    await send(client, payload)
    record = await settled(runtime, payload["id"], state="dead")
    assert "not found" in record.deliveries[0].last_error
    assert record.deliveries[0].attempts == 1
    assert (
        metric(runtime, "receiver_events_total", {"event": "job.completed", "outcome": "dead"}) == 1
    )
    sim.jobs[job.id] = job
    ops = await aiohttp_client(runtime.ops_app())
    response = await ops.post(f"/admin/events/{payload['id']}/redeliver")
    assert response.status == 200
    assert (await response.json())["data"]["redelivered"] == 1
    await settled(runtime, payload["id"])
    assert set(files_under(dl)) == expected_files(sim, [payload])


async def test_rejected_api_key_is_loud_retried_and_recovers(pipeline):
    runtime, client, sim, _dl = pipeline
    sim.api_key = "service_" + "cd" * 32
    payload = sim.add_job("image")
    with capture_logs() as logs:
        await send(client, payload)

        async def refused_twice():
            return (
                metric(
                    runtime,
                    "receiver_upstream_requests_total",
                    {"endpoint": "/jobs/{id}", "status": "401"},
                )
                >= 2
            )

        await wait_for(refused_twice, what="two refused calls")
        sim.api_key = API_KEY
        await settled(runtime, payload["id"])
    errors = [line for line in logs if line["log_level"] == "error"]
    assert any("API key" in line["event"] for line in errors)
    assert API_KEY not in repr(logs)


async def test_failed_job_event_is_processed_without_files(pipeline):
    runtime, client, sim, dl = pipeline
    payload = sim.add_failed_job("image", error="the provider refused the prompt")
    await send(client, payload)
    record = await settled(runtime, payload["id"])
    assert record.deliveries[0].state == "done"
    assert files_under(dl) == []


async def test_job_urls_are_used_when_the_event_names_no_assets(pipeline):
    runtime, client, sim, dl = pipeline
    rely_on(sim, job=["urls"])
    payload = sim.add_job("scene", item_name="beach")
    payload.pop("asset_ids", None)
    await send(client, payload)
    await settled(runtime, payload["id"])
    names = files_under(dl)
    assert names and all(f"-{payload['job_id']}." in name for name in names)


async def test_hostile_item_names_stay_inside_the_download_directory(pipeline):
    runtime, client, sim, dl = pipeline
    rely_on(sim, event=["asset_ids"], job=["item_name"])
    payloads = [
        sim.add_job("image", item_name=name)
        for name in ("../../../etc/passwd", "/abs/path", "a\\..\\b", "nul\x00byte", "x" * 600, "..")
    ]
    for payload in payloads:
        await send(client, payload)
    for payload in payloads:
        await settled(runtime, payload["id"])
    root = dl.resolve()
    written = [p for p in dl.rglob("*") if p.is_file()]
    assert len(written) == 2 * len(payloads)
    for path in written:
        assert path.resolve().is_relative_to(root)
    assert not any(p.name == "passwd" for p in root.parent.rglob("passwd"))


async def test_max_attempts_ends_dead_and_redeliver_dead_recovers(
    aiohttp_client, tmp_path, upstream
):
    runtime = Runtime(make_settings(tmp_path, upstream, max_attempts=2))
    async with runtime:
        client = await aiohttp_client(runtime.public_app())
        upstream.error_fraction = 1.0
        payload = upstream.add_job("image")
        await send(client, payload)
        record = await settled(runtime, payload["id"], state="dead")
        assert record.deliveries[0].attempts == 2
        assert record.deliveries[0].last_error.startswith("gave up after 2 attempts")
        upstream.error_fraction = 0.0
        assert await redeliver(runtime.store, now=time.time()) == 1
        runtime.wake_worker()
        await settled(runtime, payload["id"])


async def test_ops_listener(pipeline, aiohttp_client):
    runtime, client, sim, _dl = pipeline
    payload = sim.add_job("image")
    await send(client, payload)
    await settled(runtime, payload["id"])
    await runtime.refresh_gauges()
    ops = await aiohttp_client(runtime.ops_app())
    assert (await ops.get("/healthz")).status == 200
    ready = await ops.get("/readyz")
    assert ready.status == 200, await ready.text()
    text = await (await ops.get("/metrics")).text()
    for family in (
        "receiver_webhook_requests_total",
        "receiver_events_total",
        "receiver_sink_deliveries_total",
        "receiver_sink_delivery_seconds_bucket",
        "receiver_upstream_requests_total",
        "receiver_upstream_request_seconds_bucket",
        "receiver_inbox_events",
        "receiver_event_lag_seconds_bucket",
    ):
        assert family in text, family
    assert 'receiver_inbox_events{state="done"} 1.0' in text
    build = f'receiver_build_info{{schema="{SCHEMA_VERSION}",version="{__version__}"}} 1.0'
    assert build in text.splitlines()
    listing = await (await ops.get("/admin/events")).json()
    assert listing["data"][0]["id"] == payload["id"]
    shown = await (await ops.get(f"/admin/events/{payload['id']}")).json()
    assert shown["data"]["payload"]["job_id"] == payload["job_id"]
    assert (await ops.get("/admin/events/nope")).status == 404
    assert (await ops.post("/admin/events/nope/redeliver")).status == 404
    assert (await ops.get("/admin/events?status=weird")).status == 400


async def test_admin_token_required_when_set(aiohttp_client, tmp_path, upstream):
    settings = parse_settings(
        {
            "webhook": {"secrets": [SECRET]},
            "admin": {"token": "let-me-in"},
            "api": {"base_url": upstream.base_url},
            "store": {"url": "memory://"},
        },
        env={},
    )
    runtime = Runtime(settings, role="intake")
    async with runtime:
        ops = await aiohttp_client(runtime.ops_app())
        assert (await ops.get("/admin/events")).status == 401
        bad = await ops.get("/admin/events", headers={"Authorization": "Bearer wrong"})
        assert bad.status == 401
        good = await ops.get("/admin/events", headers={"Authorization": "Bearer let-me-in"})
        assert good.status == 200
        assert (await ops.get("/metrics")).status == 200
