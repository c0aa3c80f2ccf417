"""The receiver against an upstream whose versions move: the pinned API version, Deprecation
and Sunset headers, and job statuses outside the spec's four.

The upstream is the hand-written one of the spec conformance tests
(:mod:`tests.support.spec_upstream`), served over real HTTP and scripted per request; the real
receiver (intake, worker, sinks, ops listener) runs against it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.store.records import EventRecord
from tests.support.helpers import wait_for
from tests.support.peers import Capture
from tests.support.pull import API_KEY, idle, metric, receiver_config, send_webhook
from tests.support.spec_upstream import (
    Answer,
    SpecUpstream,
    error,
    file_answer,
    ok,
    serve_spec_upstream,
)

JOB = "5f0c1e2d-3a4b-4c5d-8e6f-708192a3b4c5"
ASSET = "9e8d7c6b-5a49-4382-9716-05f4e3d2c1b0"
CREATED = "2026-08-01T10:00:00+00:00"
PNG = b"\x89PNG\r\n\x1a\n" + b"versions" * 8
VERSION = "2026-05-23"
REFUSED_LOG = "the upstream refuses the pinned API version"


def job(status: str | None, **more: Any) -> dict[str, Any]:
    """A Job with its required fields; ``status=None`` leaves the status out."""
    data: dict[str, Any] = {
        "id": JOB,
        "type": "image_generation",
        "collection_id": None,
        "cost_credits": 1,
        "created_at": CREATED,
        "updated_at": CREATED,
        **more,
    }
    if status is not None:
        data["status"] = status
    return data


def asset(status: str, file_url: str | None) -> dict[str, Any]:
    return {
        "id": ASSET,
        "type": "image",
        "status": status,
        "item_id": None,
        "file_url": file_url,
        "cdn_url": None,
        "created_at": CREATED,
    }


def body(**more: Any) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "object": "event",
        "event": "job.completed",
        "job_id": JOB,
        **more,
    }


def with_headers(answer: Answer, **headers: str) -> Answer:
    return Answer(answer.status, answer.body, {**answer.headers, **headers})


@dataclass
class Stack:
    runtime: Runtime
    public: Any
    ops: Any
    upstream: SpecUpstream
    forward: Capture
    logs: list[dict[str, Any]]
    downloads: Path

    def logged(self, event: str) -> list[dict[str, Any]]:
        return [entry for entry in self.logs if entry["event"].startswith(event)]

    def files(self) -> list[str]:
        root = self.downloads
        return sorted(p.name for p in root.rglob("*") if p.is_file()) if root.exists() else []

    async def record(self, event_id: str) -> EventRecord:
        record = await self.runtime.store.get(event_id)
        assert record is not None
        return record

    async def fetched(self, event_id: str, at_least: int) -> EventRecord:
        """The event once its job was fetched ``at_least`` times without success."""

        async def tried() -> bool:
            return (await self.record(event_id)).enrich_attempts >= at_least

        await wait_for(tried, 15, what=f"{at_least} failed fetches")
        return await self.record(event_id)

    async def readyz(self) -> tuple[int, dict[str, Any]]:
        response = await self.ops.get("/readyz")
        return response.status, await response.json()


@pytest.fixture
def max_attempts() -> int:
    return 12


@pytest.fixture
async def stack(aiohttp_server, aiohttp_client, tmp_path, max_attempts):
    upstream = await serve_spec_upstream(aiohttp_server)
    forward = Capture()
    forward.url = str((await aiohttp_server(forward.app())).make_url("/hook"))
    data = receiver_config(
        tmp_path,
        upstream,  # only its base_url is read
        api={
            "base_url": upstream.base_url,
            "api_key": API_KEY,
            "timeout_seconds": 5,
            "watchdog_interval_seconds": 0,
            "version": VERSION,
        },
    )
    data["worker"]["max_attempts"] = max_attempts
    data["sinks"].append(
        {"name": "forward", "type": "http", "url": forward.url, "secret": "s" * 24}
    )
    runtime = Runtime(parse_settings(data, env={}))
    with capture_logs() as logs:
        async with runtime:
            public = await aiohttp_client(runtime.public_app())
            ops = await aiohttp_client(runtime.ops_app())
            yield Stack(runtime, public, ops, upstream, forward, logs, tmp_path / "dl")


def forwarded_jobs(stack: Stack) -> list[dict[str, Any]]:
    return [json.loads(r.body)["job"] for r in stack.forward.requests]


# -- the pinned version -----------------------------------------------------------------------


async def test_every_upstream_request_carries_the_pinned_version(stack):
    url = stack.upstream.serve_file("a.png", file_answer(PNG))
    stack.upstream.job(JOB, ok(job("completed")))
    stack.upstream.asset(ASSET, ok(asset("completed", url)))
    await send_webhook(stack.public, body(asset_ids={"image": ASSET}))
    await idle(stack.runtime)

    api_calls = [r for r in stack.upstream.requests if r.path.startswith("/v1/")]
    assert {f"/v1/jobs/{JOB}", f"/v1/assets/{ASSET}"} <= {r.path for r in api_calls}
    assert {r.headers.get("Service-API-Version") for r in api_calls} == {VERSION}
    assert stack.files() == [f"image-{ASSET}.png"]


REFUSALS = {
    "param": {
        "code": "validation_failed",
        "message": "Invalid header.",
        "param": "Service-API-Version",
    },
    "code": {"code": "unsupported_api_version", "message": "Not supported."},
    "message": {
        "code": "validation_failed",
        "message": f"Service-API-Version {VERSION} is not a version this service knows.",
    },
}


@pytest.mark.parametrize("max_attempts", [2])
@pytest.mark.parametrize("form", sorted(REFUSALS))
async def test_a_refused_version_keeps_events_and_makes_readyz_say_why(stack, form):
    """A 400 naming the version: logged at error level once, /readyz 503 with the reason, the
    event retried past max_attempts and never dead; once the upstream accepts the version the
    event is delivered and /readyz is ready again."""
    refused = Answer(400, json.dumps({"error": REFUSALS[form]}).encode(), {})
    stack.upstream.job(JOB, refused)
    first, second = body(), body()
    await send_webhook(stack.public, first)
    await send_webhook(stack.public, second)

    waiting = await stack.fetched(first["id"], 4)  # twice max_attempts, and not dead
    assert waiting.state == "pending"
    assert {d.state for d in waiting.deliveries} == {"pending"}
    assert waiting.enrich_error is not None and f"pinned API version {VERSION}" in (
        waiting.enrich_error
    )
    await stack.fetched(second["id"], 4)
    status, ready = await stack.readyz()
    assert status == 503
    (reason,) = [r for r in ready["reasons"] if r.startswith("upstream:")]
    assert f"pinned API version {VERSION}" in reason and "was refused" in reason
    assert metric(stack.runtime, "receiver_upstream_version_refused") == 1
    refusals = stack.logged(REFUSED_LOG)
    assert [(e["log_level"], e["api_version"]) for e in refusals] == [("error", VERSION)]
    assert stack.logged("event dead") == [] and stack.forward.requests == []

    stack.upstream.job(JOB, ok(job("completed")))
    stack.runtime.wake_worker()
    await idle(stack.runtime)

    assert [(await stack.record(e["id"])).state for e in (first, second)] == ["done", "done"]
    assert len(stack.forward.requests) == 2
    assert await stack.readyz() == (200, {"status": "ready"})
    assert metric(stack.runtime, "receiver_upstream_version_refused") == 0
    assert len(stack.logged(REFUSED_LOG)) == 1


async def test_a_400_about_something_else_is_not_a_version_problem(stack):
    stack.upstream.job(JOB, error(400, "validation_failed", "timeout must be a number."))
    event = body()
    await send_webhook(stack.public, event)
    await idle(stack.runtime)

    assert (await stack.record(event["id"])).state == "dead"
    assert await stack.readyz() == (200, {"status": "ready"})
    assert stack.logged(REFUSED_LOG) == []


# -- Deprecation and Sunset -------------------------------------------------------------------

DEPRECATED_AT = datetime(2026, 9, 1, tzinfo=UTC)
SUNSET_AT = datetime(2027, 3, 1, 12, 30, tzinfo=UTC)
LINKS = (
    '<https://docs.example.com/deprecations/jobs>; rel="deprecation"; type="text/html", '
    '<https://docs.example.com/sunset>; rel="sunset"'
)


async def test_deprecation_and_sunset_are_counted_exported_and_logged_once(stack):
    announced = with_headers(
        ok(job("completed")),
        Deprecation=f"@{int(DEPRECATED_AT.timestamp())}",
        Sunset=format_datetime(SUNSET_AT, usegmt=True),
        Link=LINKS,
    )
    stack.upstream.job(JOB, announced)
    for _ in range(3):
        await send_webhook(stack.public, body())
    await idle(stack.runtime)

    endpoint = {"endpoint": "/jobs/{id}"}
    assert metric(stack.runtime, "receiver_upstream_deprecated_total", endpoint) == 3
    sunset = metric(stack.runtime, "receiver_upstream_sunset_timestamp_seconds", endpoint)
    assert sunset == SUNSET_AT.timestamp()
    (warning,) = stack.logged("the upstream announces")
    assert warning["log_level"] == "warning"
    assert warning["endpoint"] == "/jobs/{id}"
    assert warning["deprecated_at"] == DEPRECATED_AT.isoformat()
    assert warning["sunset_at"] == SUNSET_AT.isoformat()
    assert warning["deprecation_link"] == "https://docs.example.com/deprecations/jobs"
    assert warning["sunset_link"] == "https://docs.example.com/sunset"
    # The events themselves are processed as usual.
    assert len(stack.forward.requests) == 3


async def test_an_unreadable_deprecation_header_is_ignored_with_a_debug_line(stack):
    stack.upstream.job(
        JOB, with_headers(ok(job("completed")), Deprecation="soon", Sunset="next spring")
    )
    await send_webhook(stack.public, body())
    await idle(stack.runtime)

    endpoint = {"endpoint": "/jobs/{id}"}
    assert metric(stack.runtime, "receiver_upstream_deprecated_total", endpoint) == 0
    assert (
        stack.runtime.metrics.registry.get_sample_value(
            "receiver_upstream_sunset_timestamp_seconds", endpoint
        )
        is None
    )
    ignored = stack.logged("unreadable")
    assert sorted((e["log_level"], e["event"]) for e in ignored) == [
        ("debug", "unreadable Deprecation header ignored"),
        ("debug", "unreadable Sunset header ignored"),
    ]
    assert stack.logged("the upstream announces") == []
    assert len(stack.forward.requests) == 1


# -- job and asset statuses outside the spec ----------------------------------------------------

INVALID_STATUS = {"object": "job", "field": "status"}


@pytest.mark.parametrize("status", ["queued", None])
async def test_an_unknown_job_status_waits_then_is_delivered_once(stack, status):
    """A status outside pending, processing, completed, failed (or none) is not finished: the
    event waits, counted as invalid, and is delivered exactly once when the job completes."""
    url = stack.upstream.serve_file("a.png", file_answer(PNG))
    stack.upstream.job(JOB, ok(job(status)))
    stack.upstream.asset(ASSET, ok(asset("completed", url)))
    event = body(asset_ids={"image": ASSET})
    await send_webhook(stack.public, event)

    waiting = await stack.fetched(event["id"], 3)
    assert waiting.state == "pending" and waiting.snapshot is None
    assert {d.state for d in waiting.deliveries} == {"pending"}
    shown = "'queued'" if status else "none"
    assert waiting.enrich_error is not None
    assert f"job {JOB} has status {shown}, not one of the spec's" in waiting.enrich_error
    assert metric(stack.runtime, "receiver_upstream_invalid_total", INVALID_STATUS) >= 3
    assert stack.forward.requests == [] and stack.files() == []
    assert stack.upstream.to(f"/v1/assets/{ASSET}") == []  # not even looked at yet

    stack.upstream.job(JOB, ok(job("completed")))
    stack.runtime.wake_worker()
    await idle(stack.runtime)

    record = await stack.record(event["id"])
    assert record.state == "done"
    assert {d.sink: d.state for d in record.deliveries} == {"files": "done", "forward": "done"}
    assert [j["status"] for j in forwarded_jobs(stack)] == ["completed"]
    assert stack.files() == [f"image-{ASSET}.png"]


@pytest.mark.parametrize("max_attempts", [3])
async def test_a_job_status_that_stays_unknown_ends_dead_and_is_redeliverable(stack):
    stack.upstream.job(JOB, ok(job("queued")))
    event = body()
    await send_webhook(stack.public, event)
    await idle(stack.runtime)

    record = await stack.record(event["id"])
    assert record.state == "dead" and record.enrich_attempts == 3
    for delivery in record.deliveries:
        assert delivery.state == "dead"
        assert delivery.last_error is not None
        assert "gave up after 3 attempts" in delivery.last_error
        assert "has status 'queued'" in delivery.last_error
    assert stack.forward.requests == []
    assert metric(stack.runtime, "receiver_upstream_invalid_total", INVALID_STATUS) == 3

    stack.upstream.job(JOB, ok(job("completed")))
    response = await stack.ops.post(f"/admin/events/{event['id']}/redeliver")
    assert response.status == 200
    stack.runtime.wake_worker()

    async def delivered() -> bool:
        return (await stack.record(event["id"])).state == "done"

    await wait_for(delivered, 15, what="the redelivered event delivered")
    assert [j["status"] for j in forwarded_jobs(stack)] == ["completed"]


async def test_an_asset_status_other_than_completed_waits(stack):
    """The spec shows no asset status values: only ``completed`` is ready; any other (here one
    no upstream documents) waits, and the asset is delivered once it is completed."""
    url = stack.upstream.serve_file("a.png", file_answer(PNG))
    stack.upstream.job(JOB, ok(job("completed")))
    stack.upstream.asset(ASSET, ok(asset("uploading", url)))
    event = body(asset_ids={"image": ASSET})
    await send_webhook(stack.public, event)

    waiting = await stack.fetched(event["id"], 3)
    assert waiting.state == "pending"
    assert waiting.enrich_error is not None and "is uploading" in waiting.enrich_error
    assert stack.forward.requests == [] and stack.files() == []

    stack.upstream.asset(ASSET, ok(asset("completed", url)))
    stack.runtime.wake_worker()
    await idle(stack.runtime)

    assert (await stack.record(event["id"])).state == "done"
    assert len(stack.forward.requests) == 1
    assert stack.files() == [f"image-{ASSET}.png"]
