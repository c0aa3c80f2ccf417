"""The receiver against the spec itself: the upstream's error bodies, and answers without one.

The upstream here is hand-written (:mod:`tests.support.spec_upstream`): a 404 or 400 with only
the spec's ``code`` and ``message`` (for a job, dead at once with the reason; for an asset the
event names, a 404 waits: derived formats can finish after their job), 429 with and without
Retry-After, 409, 5xx, a proxy's HTML 502 and a 2xx without ``data`` (retried), and 401/403
(retried, logged at error). The real receiver (intake, worker, sinks) runs against it; outcomes
are read where an operator would: files on disk, bodies the http and chat sinks posted, event
and delivery states in the inbox, log lines, metrics. ``docs/upstream.md`` lists every field
the receiver reads and the test that shows it going without.
"""

from __future__ import annotations

import json
import uuid

import pytest

from tests.support.helpers import wait_for
from tests.support.pull import API_KEY, idle, metric, send_webhook
from tests.support.spec_conformance_cases import (
    ALL_SINKS,
    ASSET,
    DERIVED,
    JOB,
    PNG,
    PROXY_PAGE,
    minimal_asset,
    minimal_body,
    minimal_job,
    stack,
)
from tests.support.spec_upstream import (
    error,
    file_answer,
    ok,
    raw,
)

__all__ = ["stack"]  # fixtures, used by name


# -- error bodies -----------------------------------------------------------------------------


async def test_a_404_with_only_code_and_message_is_refused_with_its_reason(stack):
    """404 ``{"error": {"code", "message"}}`` for the job: it is gone; the event is dead at
    once (no retries), every delivery says why, and ``events redeliver`` can recover it."""
    stack.upstream.job(JOB, error(404, "not_found", "Resource not found"))
    body = minimal_body("job.completed", asset_ids={"image": ASSET})

    await send_webhook(stack.public, body)
    await idle(stack.runtime)

    record = await stack.record(body["id"])
    reason = f"job {JOB} not found upstream"
    assert record.state == "dead"
    assert {d.sink: d.state for d in record.deliveries} == dict.fromkeys(ALL_SINKS, "dead")
    assert all(reason in (d.last_error or "") for d in record.deliveries)
    assert len(stack.upstream.to(f"/v1/jobs/{JOB}")) == 1
    (dead,) = stack.logged("event dead: the job could not be fetched")
    assert dead["log_level"] == "error" and reason in dead["error"]
    assert stack.forward.requests == stack.chat.requests == []


async def test_an_asset_the_upstream_does_not_know_yet_waits_then_is_delivered(stack):
    """The spec's States: "Derived formats can finish after the parent job, so a completed
    parent does not guarantee every derived asset exists." An asset the event names that
    answers 404: the event waits (neither dead at once nor delivered without that file) and
    goes out with every file once the asset exists."""
    image = minimal_asset(ASSET, stack.upstream.serve_file("ready.png", file_answer(PNG)))
    late = stack.upstream.serve_file("late.mp4", file_answer(b"hevc bytes", "video/mp4"))
    hevc = minimal_asset(DERIVED, late, type="hevc")
    gone = error(404, "not_found", "Resource not found")
    stack.upstream.job(JOB, ok(minimal_job("completed")))
    stack.upstream.asset(ASSET, ok(image))
    stack.upstream.asset(DERIVED, gone, gone, gone, ok(hevc))
    body = minimal_body("job.completed", asset_ids={"image": ASSET, "hevc": DERIVED})

    await send_webhook(stack.public, body)
    await idle(stack.runtime)

    record = await stack.record(body["id"])
    assert record.state == "done"
    assert {d.sink: d.state for d in record.deliveries} == dict.fromkeys(ALL_SINKS, "done")
    assert len(stack.upstream.to(f"/v1/assets/{DERIVED}")) == 4
    assert stack.files() == {
        f"_unknown-collection/_unnamed/image-{ASSET}.png": PNG,
        f"_unknown-collection/_unnamed/hevc-{DERIVED}.mp4": b"hevc bytes",
    }
    assert [e["assets"] for e in stack.forwarded()] == [[image, hevc]]
    waits = stack.logged("fetching the job failed; will retry")
    assert len(waits) == 3
    assert all(f"asset hevc {DERIVED} not found upstream yet" in w["error"] for w in waits)
    assert stack.logged("event dead: the job could not be fetched") == []


async def test_an_asset_that_never_appears_ends_dead_after_max_attempts(stack):
    """Waiting for an asset has the same end as any retry: dead (and redeliverable) after
    ``worker.max_attempts``, every delivery naming the asset."""
    stack.upstream.job(JOB, ok(minimal_job("completed")))
    stack.upstream.asset(ASSET, error(404, "not_found", "Resource not found"))
    body = minimal_body("job.completed", asset_ids={"image": ASSET})

    await send_webhook(stack.public, body)
    await idle(stack.runtime)

    record = await stack.record(body["id"])
    reason = f"gave up after 12 attempts: asset image {ASSET} not found upstream yet"
    assert record.state == "dead"
    assert all(reason in (d.last_error or "") for d in record.deliveries)
    assert len(stack.upstream.to(f"/v1/assets/{ASSET}")) == 12
    assert stack.forward.requests == stack.chat.requests == [] and stack.files() == {}


async def test_a_400_names_the_upstream_code_and_message(stack):
    """A 4xx retrying cannot mend (400 validation_failed for an id the upstream does not
    take): dead at once, the reason carrying the upstream's code and message."""
    job_id = "job_not-a-uuid"
    stack.upstream.job(job_id, error(400, "validation_failed", "id must be a UUID"))
    body = minimal_body("job.completed", job_id=job_id)

    await send_webhook(stack.public, body)
    await idle(stack.runtime)

    record = await stack.record(body["id"])
    reason = f"upstream answered 400 validation_failed for job {job_id}: id must be a UUID"
    assert record.state == "dead"
    assert {d.last_error for d in record.deliveries} == {reason}
    assert len(stack.upstream.to(f"/v1/jobs/{job_id}")) == 1


async def test_429_without_retry_after_backs_off_then_succeeds(stack):
    job = minimal_job("completed")
    limited = error(429, "rate_limited", "Too many requests")
    stack.upstream.job(JOB, limited, limited, ok(job))
    body = minimal_body("job.completed")

    await send_webhook(stack.public, body)
    await idle(stack.runtime)

    # Each failed fetch counts as an attempt of every delivery waiting for it.
    assert await stack.states(body["id"]) == {sink: ("done", 3) for sink in ALL_SINKS}
    asked = [r.at for r in stack.upstream.to(f"/v1/jobs/{JOB}")]
    assert len(asked) == 3
    # Exponential backoff with jitter from worker.backoff_initial_seconds (0.05 s here).
    assert asked[1] - asked[0] >= 0.02 and asked[2] - asked[1] >= 0.04
    retries = stack.logged("fetching the job failed; will retry")
    assert [r["attempt"] for r in retries] == [1, 2]
    assert all(r["error"].startswith("upstream answered 429 rate_limited") for r in retries)
    assert [e["job"] for e in stack.forwarded()] == [job]


async def test_after_a_429_with_retry_after_nothing_is_asked_until_then(stack):
    """The spec's Errors, rule 2: "After a 429, clients wait for Retry-After when present". A
    job answered 429 with ``Retry-After: 3``: no request, for that event or any other, reaches
    the upstream in those 3 seconds; then every event is delivered."""
    limited = error(429, "rate_limited", "Too many requests", {"Retry-After": "3"})
    stack.upstream.job(JOB, limited, ok(minimal_job("completed")))
    others = [str(uuid.uuid4()) for _ in range(3)]
    for job_id in others:
        stack.upstream.job(job_id, ok(minimal_job("completed", job_id)))
    first = minimal_body("job.completed")
    await send_webhook(stack.public, first)

    async def refused() -> bool:
        return bool(stack.upstream.to(f"/v1/jobs/{JOB}"))

    await wait_for(refused, 10, what="the 429")
    bodies = [minimal_body("job.completed", job_id) for job_id in others]
    for body in bodies:
        await send_webhook(stack.public, body)
    await idle(stack.runtime)

    refused_at = stack.upstream.to(f"/v1/jobs/{JOB}")[0].at
    for job_id in [JOB, *others]:
        asked = [r.at for r in stack.upstream.to(f"/v1/jobs/{job_id}")]
        assert asked[-1] >= refused_at + 3, (job_id, [a - refused_at for a in asked])
    assert len(stack.upstream.to(f"/v1/jobs/{JOB}")) == 2
    for body in [first, *bodies]:
        assert (await stack.record(body["id"])).state == "done"
    held = [r["error"] for r in stack.logged("fetching the job failed; will retry")]
    assert any("it asked to wait" in reason for reason in held), held


async def test_a_502_that_is_not_json_is_transient(stack):
    """A proxy's HTML error page on a 502: retried, then the job (and asset) arrive."""
    url = stack.upstream.serve_file("p.png", file_answer(PNG))
    stack.upstream.job(JOB, raw(502, PROXY_PAGE), ok(minimal_job("completed")))
    stack.upstream.asset(ASSET, raw(502, PROXY_PAGE), ok(minimal_asset(ASSET, url)))
    body = minimal_body("job.completed", asset_ids={"image": ASSET})

    await send_webhook(stack.public, body)
    await idle(stack.runtime)

    assert await stack.states(body["id"]) == {sink: ("done", 3) for sink in ALL_SINKS}
    assert stack.files() == {f"_unknown-collection/_unnamed/image-{ASSET}.png": PNG}
    errors = [r["error"] for r in stack.logged("fetching the job failed; will retry")]
    assert errors == [
        f"upstream answered 502 for job {JOB}",
        f"upstream answered 502 for asset {ASSET}",
    ]
    assert not any("<html" in json.dumps(entry, default=str) for entry in stack.logs)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (error(409, "conflict", "Resource busy"), "upstream answered 409 conflict for job"),
        (
            error(503, "upstream_error", "A provider failed"),
            "upstream answered 503 upstream_error for job",
        ),
        (raw(200, "{}", "application/json"), "upstream answered 200 for job"),
        (raw(200, '{"data": null}', "application/json"), "upstream answered 200 for job"),
    ],
    ids=["409", "503", "200-without-data", "200-data-null"],
)
async def test_a_transient_answer_is_retried(stack, answer, reason):
    """409 (the spec's "resource changed or busy"), 5xx with the spec's body, and a 2xx
    without ``data``: retried, then the job arrives."""
    job = minimal_job("completed")
    stack.upstream.job(JOB, answer, ok(job))
    body = minimal_body("job.completed")

    await send_webhook(stack.public, body)
    await idle(stack.runtime)

    assert await stack.states(body["id"]) == {sink: ("done", 2) for sink in ALL_SINKS}
    (retry,) = stack.logged("fetching the job failed; will retry")
    assert retry["error"].startswith(reason)
    assert [e["job"] for e in stack.forwarded()] == [job]


@pytest.mark.parametrize(("status", "code"), [(401, "unauthorized"), (403, "forbidden")])
async def test_a_refused_key_is_retried_and_logged_at_error(stack, status, code):
    """401/403: retried with the same backoff (fixing the key recovers everything), logged at
    error level and counted, nothing dropped."""
    refused = error(status, code, "Invalid API key")
    stack.upstream.job(JOB, refused, refused, ok(minimal_job("failed")))
    body = minimal_body("job.failed")

    await send_webhook(stack.public, body)
    await idle(stack.runtime)

    assert await stack.states(body["id"]) == {sink: ("done", 3) for sink in ALL_SINKS}
    loud = stack.logged("upstream refused the API key")
    assert [(e["log_level"], e["status"], e["code"]) for e in loud] == [("error", status, code)] * 2
    assert API_KEY not in json.dumps(stack.logs, default=str)
    counted = {"endpoint": "/jobs/{id}", "status": str(status)}
    assert metric(stack.runtime, "receiver_upstream_requests_total", counted) == 2
    assert len(stack.chat.requests) == 1
