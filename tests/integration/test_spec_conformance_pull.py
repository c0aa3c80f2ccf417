"""The receiver against the spec itself: pull mode and reconcile on the least the spec allows.

The upstream here is hand-written (:mod:`tests.support.spec_upstream`): a watched job long-polled
in its minimal form (or unknown upstream), and a collection's asset list in minimal pages (a
page size the upstream picks, a 429 on a page, a list without ``meta``) walked by reconcile,
with the real receiver (poller, reconcile, worker, sinks) running against it. Outcomes are read
where an operator would: files on disk, bodies the http and chat sinks posted, event and watch
states in the inbox, reconcile summaries. ``docs/upstream.md`` lists every field the receiver
reads and the test that shows it going without.
"""

from __future__ import annotations

from typing import Any

from receiver.pull.reconcile import Reconciler
from tests.support.helpers import wait_for
from tests.support.pull import idle
from tests.support.spec_conformance_cases import (
    ASSET,
    ASSET_OPTIONAL_NULL,
    COLLECTION,
    ITEM,
    JOB,
    PNG,
    UPDATED,
    Stack,
    minimal_asset,
    minimal_job,
    stack,
)
from tests.support.spec_upstream import (
    error,
    file_answer,
    ok,
)

__all__ = ["stack"]  # fixtures, used by name


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
