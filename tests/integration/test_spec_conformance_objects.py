"""The receiver against the spec itself: the webhook body, job and asset in their least form.

The upstream here is hand-written (:mod:`tests.support.spec_upstream`): each test writes the
JSON of the webhook body, job and asset in the minimal form ``upstream-api-spec.md`` allows
(only required fields; nullable ones null, or absent), and the real receiver (intake, worker,
sinks) runs against it: a body without a guaranteed field refused, minimal jobs and assets
delivered, an unfinished job or asset and a file URL allocated before its file waiting, unknown
fields ignored. Outcomes are read where an operator would: files on disk, bodies the http and
chat sinks posted, event and delivery states in the inbox, log lines. ``docs/upstream.md``
lists every field the receiver reads and the test that shows it going without; pull mode and
reconcile are in test_spec_conformance_pull.py, error bodies in test_spec_conformance_errors.py.
"""

from __future__ import annotations

import json
import time

import pytest

from receiver.signature import webhook_headers
from receiver.store.records import EventRecord
from tests.support.helpers import wait_for
from tests.support.pull import API_KEY, SECRET, idle, send_webhook
from tests.support.spec_conformance_cases import (
    ALL_SINKS,
    ASSET,
    ASSET_OPTIONAL_NULL,
    COLLECTION,
    JOB,
    JOB_OPTIONAL_NULL,
    PNG,
    Stack,
    minimal_asset,
    minimal_body,
    minimal_job,
    stack,
)
from tests.support.spec_upstream import (
    error,
    file_answer,
    ok,
)

__all__ = ["stack"]  # fixtures, used by name


async def enrich_attempts(stack: Stack, event_id: str, at_least: int) -> EventRecord:
    """Wait until the event's job was fetched ``at_least`` times without success."""

    async def tried() -> bool:
        return (await stack.record(event_id)).enrich_attempts >= at_least

    await wait_for(tried, 10, what=f"{at_least} failed fetches")
    return await stack.record(event_id)


# -- webhook body and job ---------------------------------------------------------------------


@pytest.mark.parametrize("form", ["absent", "null"])
@pytest.mark.parametrize("event", ["job.completed", "job.failed"])
async def test_minimal_body_and_minimal_job_are_delivered(stack, event, form):
    """Body: only id, object, event, job_id. Job: only its required fields; its optional
    item_id, item_name and error absent, or null; no urls. Delivered to every sink once."""
    status = "completed" if event == "job.completed" else "failed"
    job = minimal_job(status, **(JOB_OPTIONAL_NULL if form == "null" else {}))
    stack.upstream.job(JOB, ok(job))
    body = minimal_body(event)

    answer = await send_webhook(stack.public, body)
    assert answer == {"received": True, "id": body["id"], "duplicate": False}
    await idle(stack.runtime)

    assert (await stack.record(body["id"])).state == "done"
    assert await stack.states(body["id"]) == {sink: ("done", 1) for sink in ALL_SINKS}
    (fetched,) = stack.upstream.calls()  # the job, once; no asset, no file
    assert (fetched.method, fetched.path) == ("GET", f"/v1/jobs/{JOB}")
    assert fetched.headers["Authorization"] == f"Bearer {API_KEY}"
    (enriched,) = stack.forwarded()
    assert (enriched["event"], enriched["job"], enriched["assets"]) == (body, job, [])
    # No asset ids and no urls: nothing to download, and that is a success, not a retry.
    assert stack.files() == {}
    if event == "job.completed":
        assert stack.chat_texts() == [f"✅ job.completed: image_generation job {JOB}"]
    else:
        assert stack.chat_texts() == [
            f"❌ job.failed: image_generation job {JOB} failed: no error given"
        ]


@pytest.mark.parametrize("missing", ["id", "object", "event", "job_id"])
async def test_a_body_without_a_guaranteed_field_is_refused(stack, missing):
    body = minimal_body("job.completed")
    del body[missing]
    raw_body = json.dumps(body).encode()
    headers = webhook_headers(
        SECRET, raw_body, int(time.time()), event_id=body.get("id"), event_name=body.get("event")
    )
    response = await stack.public.post("/webhooks", data=raw_body, headers=headers)

    assert response.status == 400
    problem = (await response.json())["error"]
    assert problem["code"] == "malformed_payload"
    assert repr(missing) in problem["message"]
    assert await stack.runtime.store.list() == []
    assert stack.upstream.calls() == []


# -- asset ------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["absent", "null", "collection from the job"])
async def test_a_minimal_asset_is_downloaded(stack, form):
    """Asset: only its required fields (item_id, cdn_url null); metadata, collection_id,
    is_archived, archived_at absent or null. The file lands under the job's collection, else
    ``_unknown-collection``, and ``_unnamed`` (the job names no item)."""
    url = stack.upstream.serve_file("a.png", file_answer(PNG))
    asset = minimal_asset(ASSET, url, **(ASSET_OPTIONAL_NULL if form == "null" else {}))
    job_collection = COLLECTION if form == "collection from the job" else None
    stack.upstream.job(JOB, ok(minimal_job("completed", collection_id=job_collection)))
    stack.upstream.asset(ASSET, ok(asset))
    body = minimal_body("job.completed", asset_ids={"image": ASSET})

    await send_webhook(stack.public, body)
    await idle(stack.runtime)

    folder = job_collection or "_unknown-collection"
    assert stack.files() == {f"{folder}/_unnamed/image-{ASSET}.png": PNG}
    assert await stack.states(body["id"]) == {sink: ("done", 1) for sink in ALL_SINKS}
    (enriched,) = stack.forwarded()
    assert enriched["assets"] == [asset]
    # cdn_url null: the chat message counts the asset by its signed file_url.
    assert stack.chat_texts() == [f"✅ job.completed: image_generation job {JOB} (1 asset)"]


@pytest.mark.parametrize("unfinished", ["job", "asset"])
async def test_an_unfinished_job_or_asset_waits_then_is_delivered(stack, unfinished):
    """A job still ``processing``, or an asset not ``completed`` whose file_url is null: the
    event waits (retried, never dead nor skipped) and is delivered once it is finished."""
    url = stack.upstream.serve_file("late.png", file_answer(PNG))
    asset = minimal_asset(ASSET, url)
    if unfinished == "job":
        stack.upstream.job(JOB, ok(minimal_job("processing")))
        stack.upstream.asset(ASSET, ok(asset))
    else:
        stack.upstream.job(JOB, ok(minimal_job("completed")))
        stack.upstream.asset(ASSET, ok(minimal_asset(ASSET, None, status="processing")))
    body = minimal_body("job.completed", asset_ids={"image": ASSET})
    await send_webhook(stack.public, body)

    waiting = await enrich_attempts(stack, body["id"], 2)
    assert waiting.state == "pending" and waiting.snapshot is None
    assert {d.state for d in waiting.deliveries} == {"pending"}
    reason = f"job {JOB} is still processing" if unfinished == "job" else "is processing"
    assert waiting.enrich_error is not None and reason in waiting.enrich_error
    assert stack.files() == {} and stack.forward.requests == []

    stack.upstream.job(JOB, ok(minimal_job("completed")))
    stack.upstream.asset(ASSET, ok(asset))
    stack.runtime.wake_worker()
    await idle(stack.runtime)

    assert (await stack.record(body["id"])).state == "done"
    assert stack.files() == {f"_unknown-collection/_unnamed/image-{ASSET}.png": PNG}
    assert [e["assets"] for e in stack.forwarded()] == [[asset]]
    assert len(stack.logged("fetching the job failed; will retry")) >= 2
    assert stack.logged("event dead: the job could not be fetched") == []


async def test_a_file_url_allocated_before_its_file_is_retried(stack):
    """The spec: "A returned file URL may be allocated before the file is ready"."""
    url = stack.upstream.serve_file(
        "soon.png", error(404, "not_found", "no such object"), file_answer(PNG)
    )
    stack.upstream.job(JOB, ok(minimal_job("completed")))
    stack.upstream.asset(ASSET, ok(minimal_asset(ASSET, url)))
    body = minimal_body("job.completed", asset_ids={"image": ASSET})

    await send_webhook(stack.public, body)
    await idle(stack.runtime)

    states = await stack.states(body["id"])
    assert states["files"] == ("done", 2)
    assert states["forward"] == states["chat"] == ("done", 1)
    assert stack.files() == {f"_unknown-collection/_unnamed/image-{ASSET}.png": PNG}
    assert len(stack.upstream.to("/files/soon.png")) == 2


@pytest.mark.parametrize("refusal", [403, 400, 401, 410])
async def test_an_expired_file_url_is_fetched_again(stack, refusal):
    """The spec gives a signed ``file_url`` no lifetime and no answer once expired: refused the
    way object stores refuse an expired one (403; 400, 401 or 410), the asset is fetched again
    and the file downloaded from the fresh URL in the same attempt."""
    expired = stack.upstream.serve_file("old.png", error(refusal, "expired", "Request expired"))
    fresh = stack.upstream.serve_file("new.png", file_answer(PNG))
    stack.upstream.job(JOB, ok(minimal_job("completed")))
    stack.upstream.asset(ASSET, ok(minimal_asset(ASSET, expired)), ok(minimal_asset(ASSET, fresh)))
    body = minimal_body("job.completed", asset_ids={"image": ASSET})

    await send_webhook(stack.public, body)
    await idle(stack.runtime)

    assert (await stack.states(body["id"]))["files"] == ("done", 1)
    assert stack.files() == {f"_unknown-collection/_unnamed/image-{ASSET}.png": PNG}
    assert len(stack.upstream.to(f"/v1/assets/{ASSET}")) == 2
    assert len(stack.upstream.to("/files/old.png")) == len(stack.upstream.to("/files/new.png")) == 1


async def test_unknown_fields_are_ignored(stack):
    """Extra members in the body, the envelope, the job and the asset change nothing; the
    body's own (stale) ``urls`` are never fetched."""
    url = stack.upstream.serve_file("fresh.png", file_answer(PNG))
    stale = stack.upstream.serve_file("stale.png", error(403, "forbidden", "expired"))
    job = minimal_job(
        "completed",
        progress=100,
        provider={"name": "some-model", "region": None},
        tags=["a", "b"],
    )
    asset = minimal_asset(ASSET, url, width=512, height=512, file_size=None, variants=[{}])
    stack.upstream.job(JOB, ok(job, meta={"request_id": "req_1"}, links={"self": "/v1/jobs"}))
    stack.upstream.asset(ASSET, ok(asset, trace="t-1"))
    body = minimal_body(
        "job.completed",
        asset_ids={"image": ASSET},
        urls={"image": stale},
        attempt=3,
        workflow={"name": "nightly", "steps": [1, 2]},
        schema_version="2026-09-01",
    )

    await send_webhook(stack.public, body)
    await idle(stack.runtime)

    assert await stack.states(body["id"]) == {sink: ("done", 1) for sink in ALL_SINKS}
    assert stack.files() == {f"_unknown-collection/_unnamed/image-{ASSET}.png": PNG}
    assert stack.upstream.to("/files/stale.png") == []
    (enriched,) = stack.forwarded()
    assert (enriched["event"], enriched["job"], enriched["assets"]) == (body, job, [asset])
