"""The receiver against the spec itself: every object it reads, in the least the spec allows.

The upstream here is hand-written (:mod:`tests.support.spec_upstream`): each test writes the
JSON of the webhook body, job, asset, collection page or error body in the minimal form
``upstream-api-spec.md`` allows (only required fields; nullable ones null), and the real
receiver (intake, worker, sinks, poller, reconcile) runs against it. Outcomes are read where an
operator would: files on disk, bodies the http and chat sinks posted, event and delivery states
in the inbox, log lines, reconcile summaries. ``docs/upstream.md`` lists every field the
receiver reads and the test here that shows it going without.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.pull.reconcile import Reconciler
from receiver.signature import webhook_headers
from receiver.store.records import EventRecord
from tests.support.helpers import wait_for
from tests.support.peers import Capture
from tests.support.pull import API_KEY, SECRET, idle, metric, receiver_config, send_webhook
from tests.support.spec_upstream import (
    SpecUpstream,
    error,
    file_answer,
    ok,
    raw,
    serve_spec_upstream,
)

JOB = "8d3c6f0e-2b1a-4c5d-9e8f-7a6b5c4d3e2f"
ASSET = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
COLLECTION = "c0ffee00-1111-4222-8333-444455556666"
ITEM = "17e40000-aaaa-4bbb-8ccc-ddddeeeeffff"
CREATED = "2026-05-01T10:00:00+00:00"
UPDATED = "2026-05-01T10:00:42+00:00"
PNG = b"\x89PNG\r\n\x1a\n" + b"spec conformance" * 8
PROXY_PAGE = "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
ALL_SINKS = ("files", "forward", "chat")


# -- the spec's minimal objects ---------------------------------------------------------------


def minimal_body(event: str, job_id: str = JOB, **more: Any) -> dict[str, Any]:
    """A webhook body with only what the spec guarantees: id, object, event, job_id."""
    return {"id": str(uuid.uuid4()), "object": "event", "event": event, "job_id": job_id, **more}


def minimal_job(status: str, job_id: str = JOB, **more: Any) -> dict[str, Any]:
    """A Job with only its required fields (collection_id is required and nullable)."""
    return {
        "id": job_id,
        "status": status,
        "type": "image_generation",
        "collection_id": None,
        "cost_credits": 1,
        "created_at": CREATED,
        "updated_at": UPDATED,
        **more,
    }


def minimal_asset(
    asset_id: str, file_url: str | None, *, status: str = "completed", **more: Any
) -> dict[str, Any]:
    """An Asset with only its required fields (item_id, file_url, cdn_url nullable)."""
    return {
        "id": asset_id,
        "type": "image",
        "status": status,
        "item_id": None,
        "file_url": file_url,
        "cdn_url": None,
        "created_at": CREATED,
        **more,
    }


#: The Job's optional fields the receiver reads, each nullable but ``urls``.
JOB_OPTIONAL_NULL = {"item_id": None, "item_name": None, "error": None}
#: The Asset's optional fields, null where the spec allows it (is_archived is not nullable).
ASSET_OPTIONAL_NULL = {"metadata": None, "collection_id": None, "archived_at": None}


# -- the receiver under test ------------------------------------------------------------------


@dataclass
class Stack:
    runtime: Runtime
    public: Any
    ops: Any
    upstream: SpecUpstream
    forward: Capture
    chat: Capture
    logs: list[dict[str, Any]]
    downloads: Path

    def forwarded(self) -> list[dict[str, Any]]:
        """The enriched events the http sink posted."""
        return [json.loads(r.body) for r in self.forward.requests]

    def chat_texts(self) -> list[str]:
        return [json.loads(r.body)["text"] for r in self.chat.requests]

    def files(self) -> dict[str, bytes]:
        """Every file the download sink wrote, by its path under the directory."""
        root = self.downloads
        if not root.exists():
            return {}
        return {
            p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file()
        }

    def logged(self, event: str) -> list[dict[str, Any]]:
        return [entry for entry in self.logs if entry["event"] == event]

    async def record(self, event_id: str) -> EventRecord:
        record = await self.runtime.store.get(event_id)
        assert record is not None
        return record

    async def states(self, event_id: str) -> dict[str, tuple[str, int]]:
        record = await self.record(event_id)
        return {d.sink: (d.state, d.attempts) for d in record.deliveries}


async def capture_server(aiohttp_server: Any) -> Capture:
    capture = Capture()
    server = await aiohttp_server(capture.app())
    capture.url = str(server.make_url("/hook"))
    return capture


@pytest.fixture
async def stack(aiohttp_server, aiohttp_client, tmp_path):
    upstream = await serve_spec_upstream(aiohttp_server)
    forward, chat = await capture_server(aiohttp_server), await capture_server(aiohttp_server)
    data = receiver_config(
        tmp_path,
        upstream,  # only its base_url is read
        api={
            "base_url": upstream.base_url,
            "api_key": API_KEY,
            "timeout_seconds": 5,
            "watchdog_interval_seconds": 0,
        },
        pull={"wait_seconds": 1},
    )
    data["sinks"] += [
        {"name": "forward", "type": "http", "url": forward.url, "secret": "s" * 24},
        {"name": "chat", "type": "slack", "url": chat.url, "rate_limit_per_second": 0},
    ]
    runtime = Runtime(parse_settings(data, env={}))
    with capture_logs() as logs:
        async with runtime:
            public = await aiohttp_client(runtime.public_app())
            ops = await aiohttp_client(runtime.ops_app())
            yield Stack(runtime, public, ops, upstream, forward, chat, logs, tmp_path / "dl")


def reconciler(stack: Stack) -> Reconciler:
    runtime = stack.runtime
    assert runtime.upstream is not None
    return Reconciler(
        settings=runtime.settings,
        store=runtime.store,
        upstream=runtime.upstream,
        metrics=runtime.metrics,
        on_event=runtime.wake_worker,
    )


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


# -- pull mode: the job long-polled -----------------------------------------------------------


async def test_a_watched_minimal_job_becomes_an_event_and_is_delivered(stack):
    job = minimal_job("completed")
    stack.upstream.job(JOB, ok(minimal_job("pending")), ok(job))
    response = await stack.ops.post("/admin/watch", json={"job_ids": [JOB]})
    assert response.status == 202, await response.text()

    async def done() -> bool:
        events = await stack.runtime.store.list()
        return len(events) == 1 and events[0].state == "done"

    await wait_for(done, 10, what="the watched job delivered")
    (event,) = await stack.runtime.store.list()
    assert (event.event, event.payload()["source"]) == ("job.completed", "poll")
    polls = stack.upstream.to(f"/v1/jobs/{JOB}")
    assert polls[0].query == {"wait": "true", "timeout": "1"}
    # The minimal job: its type rides along, nothing else is needed.
    assert event.payload()["type"] == "image_generation"
    assert [e["job"] for e in stack.forwarded()] == [job]
    assert stack.chat_texts() == [f"✅ job.completed: image_generation job {JOB}"]


async def test_a_watched_job_the_upstream_does_not_know_ends_not_found(stack):
    stack.upstream.job(JOB, error(404, "not_found", "Job not found"))
    response = await stack.ops.post("/admin/watch", json={"job_ids": [JOB]})
    assert response.status == 202, await response.text()

    async def not_found() -> bool:
        watches = await stack.runtime.store.list_watches()
        return [w.state for w in watches] == ["not_found"]

    await wait_for(not_found, 10, what="the watch ending not_found")
    assert len(stack.upstream.to(f"/v1/jobs/{JOB}")) == 1
    assert await stack.runtime.store.list() == []


# -- collection asset list (reconcile) --------------------------------------------------------


def reconcile_assets(stack: Stack) -> list[dict[str, Any]]:
    """Six assets of COLLECTION, none naming a job or a collection (``collection_id`` absent
    or null, ``metadata`` null, absent or empty), one still processing, one archived; each
    served."""
    ids = [f"00000000-0000-4000-8000-00000000000{n}" for n in range(1, 7)]
    url = {i: stack.upstream.serve_file(f"{i}.png", file_answer(PNG)) for i in ids}
    assets = [
        minimal_asset(ids[0], url[ids[0]], item_id=ITEM, metadata=None),
        {**minimal_asset(ids[1], url[ids[1]], item_id=ITEM), "type": "transparent_image"},
        minimal_asset(ids[2], url[ids[2]], **ASSET_OPTIONAL_NULL, is_archived=False),
        minimal_asset(ids[3], None, status="processing", metadata=None),
        minimal_asset(ids[4], url[ids[4]], metadata={}, extra_field={"x": 1}),
        minimal_asset(ids[5], url[ids[5]], is_archived=True, archived_at=UPDATED),
    ]
    for asset in assets:
        stack.upstream.asset(asset["id"], ok(asset))
    return assets


def pagination(offset: int, total: int, has_more: bool) -> dict[str, Any]:
    """``meta`` of a page the upstream cut to 2, with members the spec does not name."""
    return {
        "pagination": {
            "total": total,
            "limit": 2,
            "offset": offset,
            "has_more": has_more,
            "next_cursor": "opaque",
        },
        "request_id": f"req_{offset}",
    }


async def test_reconcile_follows_the_page_size_the_upstream_answers(stack):
    """Asked for 100 a page, the upstream answers 2 (meta.pagination.limit says so): offsets
    0, 2, 4 are fetched, every asset is seen once, the completed ones are delivered once, the
    archived one is skipped; a 429 without Retry-After on a page is backed off and asked again."""
    a = reconcile_assets(stack)
    stack.upstream.page(COLLECTION, 0, ok(a[0:2], meta=pagination(0, 6, True)))
    stack.upstream.page(
        COLLECTION,
        2,
        error(429, "rate_limited", "Too many requests"),
        ok(a[2:4], meta=pagination(2, 6, True)),
    )
    stack.upstream.page(COLLECTION, 4, ok(a[4:], meta=pagination(4, 6, False)))

    first = await reconciler(stack).run(COLLECTION)
    await idle(stack.runtime)
    second = await reconciler(stack).run(COLLECTION)

    asked = [r.query for r in stack.upstream.to(f"/v1/collections/{COLLECTION}/assets")]
    assert [q["offset"] for q in asked] == ["0", "2", "2", "4", "0", "2", "4"]
    assert {q["limit"] for q in asked} == {"100"}
    assert (first.pages, first.seen, first.total, first.retries) == (3, 6, 6, 1)
    assert (first.newly_delivered, first.not_ready, first.already_delivered) == (4, 1, 0)
    assert first.skipped == {"archived": 1}
    assert (second.newly_delivered, second.already_delivered, second.events) == (0, 4, 0)
    delivered = [a[0], a[1], a[2], a[4]]
    assert stack.files() == {
        f"{COLLECTION}/_unnamed/{x['type']}-{x['id']}.png": PNG for x in delivered
    }
    forwarded = sorted(asset["id"] for e in stack.forwarded() for asset in e["assets"])
    assert forwarded == sorted(x["id"] for x in delivered)  # each once
    assert not [r for r in stack.upstream.requests if r.path.startswith("/v1/jobs/")]
    assert {e.state for e in await stack.runtime.store.list()} == {"done"}


async def test_reconcile_a_list_without_meta_is_one_page(stack):
    """``meta`` is optional in the envelope: a list without it is taken as the last page."""
    url = stack.upstream.serve_file("only.png", file_answer(PNG))
    asset = minimal_asset(ASSET, url)
    stack.upstream.asset(ASSET, ok(asset))
    stack.upstream.page(COLLECTION, 0, ok([asset]))

    summary = await reconciler(stack).run(COLLECTION)
    await idle(stack.runtime)

    assert (summary.pages, summary.seen, summary.newly_delivered, summary.total) == (1, 1, 1, None)
    assert stack.files() == {f"{COLLECTION}/_unnamed/image-{ASSET}.png": PNG}


# -- error bodies -----------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["job", "asset"])
async def test_a_404_with_only_code_and_message_is_refused_with_its_reason(stack, missing):
    """404 ``{"error": {"code", "message"}}``: the resource is gone; the event is dead at once
    (no retries), every delivery says why, and ``events redeliver`` can recover it."""
    gone = error(404, "not_found", "Resource not found")
    if missing == "job":
        stack.upstream.job(JOB, gone)
    else:
        stack.upstream.job(JOB, ok(minimal_job("completed")))
        stack.upstream.asset(ASSET, gone)
    body = minimal_body("job.completed", asset_ids={"image": ASSET})

    await send_webhook(stack.public, body)
    await idle(stack.runtime)

    record = await stack.record(body["id"])
    reason = f"job {JOB} not found upstream" if missing == "job" else f"asset {ASSET} not found"
    assert record.state == "dead"
    assert {d.sink: d.state for d in record.deliveries} == dict.fromkeys(ALL_SINKS, "dead")
    assert all(reason in (d.last_error or "") for d in record.deliveries)
    assert len(stack.upstream.to(f"/v1/{missing}s/{JOB if missing == 'job' else ASSET}")) == 1
    (dead,) = stack.logged("event dead: the job could not be fetched")
    assert dead["log_level"] == "error" and reason in dead["error"]
    assert stack.forward.requests == stack.chat.requests == []


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
