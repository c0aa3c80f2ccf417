"""Pull mode end to end over real HTTP: the simulator as upstream, the admin API, the poller,
the worker and a download sink, all in one process."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from structlog.testing import capture_logs

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.pull import poller
from tests.support.helpers import wait_for
from tests.support.pull import (
    SECRET,
    idle,
    metric,
    receiver_config,
    send_webhook,
    serve_simulator,
    successes,
)
from tests.support.upstream import rely_on


@pytest.fixture
async def upstream(aiohttp_server):
    return await serve_simulator(aiohttp_server, seed=11)


def make_settings(tmp_path, upstream, **pull):
    return parse_settings(
        receiver_config(tmp_path, upstream, pull={"wait_seconds": 2, **pull}), env={}
    )


@pytest.fixture
async def pulling(aiohttp_client, tmp_path, upstream):
    runtime = Runtime(make_settings(tmp_path, upstream))
    with capture_logs():
        async with runtime:
            public = await aiohttp_client(runtime.public_app())
            ops = await aiohttp_client(runtime.ops_app())
            yield runtime, public, ops, upstream


async def watch(ops, *job_ids):
    response = await ops.post("/admin/watch", json={"job_ids": list(job_ids)})
    assert response.status == 202, await response.text()
    answer = await response.json()
    assert answer["watching"] == [job_id.lower() for job_id in dict.fromkeys(job_ids)]
    return answer["data"]


async def watch_state(runtime, job_id, state, timeout=20.0):
    async def check():
        return any(
            w.job_id == job_id and w.state == state for w in await runtime.store.list_watches()
        )

    await wait_for(check, timeout, what=f"watch of {job_id} {state}")


async def job_events(runtime, job_id):
    return [e for e in await runtime.store.list(limit=1000) if e.job_id == job_id]


async def delivered(runtime, job_id, timeout=20.0):
    """Wait until the job's events are all done; return them."""

    async def check():
        events = await job_events(runtime, job_id)
        return bool(events) and all(e.state == "done" for e in events)

    await wait_for(check, timeout, what=f"job {job_id} delivered")
    return await job_events(runtime, job_id)


def long_polls(sim):
    return sim.requests["GET /v1/jobs/{id}"]


async def test_a_job_that_sends_no_webhook_is_delivered_through_its_watch(pulling, tmp_path):
    runtime, _public, ops, sim = pulling
    # The files of a polled job come from its urls, named after the job.
    rely_on(sim, job=["urls", "item_name", "collection_id"])
    payload = sim.add_job("image", status="processing", item_name="wave")
    job_id = payload["job_id"]

    (answer,) = await watch(ops, job_id)
    assert (answer["job_id"], answer["state"]) == (job_id, "watching")
    await wait_for(lambda: _polled(sim), what="the first long-poll")
    await asyncio.sleep(0.3)
    sim.complete_job(job_id)

    (event,) = await delivered(runtime, job_id)
    await watch_state(runtime, job_id, "done")
    assert event.event == "job.completed"
    assert event.payload()["source"] == "poll"
    job = sim.jobs[job_id]
    files = sorted(p.name for p in (tmp_path / "dl" / job.collection_id / "wave").iterdir())
    assert files == [f"image-{job_id}.png", f"transparent_image-{job_id}.png"]
    assert successes(runtime) == 1
    assert metric(runtime, "receiver_pull_events_total", {"source": "poll"}) == 1
    # The long-poll answered when the job finished: no busy polling meanwhile.
    assert long_polls(sim) <= 4

    listing = await (await ops.get("/admin/watch")).json()
    (row,) = listing["data"]
    assert (row["job_id"], row["state"]) == (job_id, "done")
    assert row["since"] <= row["last_polled_at"]
    await runtime.refresh_gauges()
    assert metric(runtime, "receiver_watched_jobs", {"state": "done"}) == 1
    assert metric(runtime, "receiver_watched_jobs", {"state": "watching"}) == 0


async def _polled(sim) -> bool:
    return long_polls(sim) >= 1


async def test_a_failed_job_becomes_job_failed(pulling):
    runtime, _public, ops, sim = pulling
    job_id = sim.add_job("image", status="processing")["job_id"]
    await watch(ops, job_id)
    sim.fail_job(job_id, "the provider returned no image")
    (event,) = await delivered(runtime, job_id)
    assert event.event == "job.failed"
    await watch_state(runtime, job_id, "done")


async def test_webhook_first_then_watch_reaches_the_sink_once(pulling):
    runtime, public, ops, sim = pulling
    payload = sim.add_job("logo")
    await send_webhook(public, payload)
    await delivered(runtime, payload["job_id"])

    await watch(ops, payload["job_id"])
    await watch_state(runtime, payload["job_id"], "done")
    await idle(runtime)
    assert [e.id for e in await job_events(runtime, payload["job_id"])] == [payload["id"]]
    assert successes(runtime) == 1
    assert metric(runtime, "receiver_pull_events_total", {"source": "webhook"}) == 1
    assert metric(runtime, "receiver_pull_events_total", {"source": "poll"}) == 0


async def test_watch_first_then_webhook_reaches_the_sink_once(pulling):
    runtime, public, ops, sim = pulling
    payload = sim.add_job("logo", status="processing")
    await watch(ops, payload["job_id"])
    payload = sim.complete_job(payload["job_id"])
    await watch_state(runtime, payload["job_id"], "done")
    await delivered(runtime, payload["job_id"])

    answer = await send_webhook(public, payload)
    assert answer["duplicate"] is True
    await idle(runtime)
    (event,) = await job_events(runtime, payload["job_id"])
    assert event.payload()["source"] == "poll"
    assert successes(runtime) == 1
    assert metric(runtime, "receiver_webhook_requests_total", {"outcome": "duplicate"}) == 1


async def test_watch_and_webhook_at_the_same_moment_reach_the_sink_once(pulling):
    runtime, public, ops, sim = pulling
    jobs = [sim.add_job("logo", status="processing")["job_id"] for _ in range(6)]
    await watch(ops, *jobs)
    await wait_for(lambda: _all_polling(sim, len(jobs)), what="every job long-polled")

    async def finish(job_id):
        payload = sim.complete_job(job_id)  # the long-poll answers now ...
        await send_webhook(public, payload)  # ... while the webhook arrives

    await asyncio.gather(*(finish(job_id) for job_id in jobs))
    for job_id in jobs:
        assert len(await delivered(runtime, job_id)) == 1
        await watch_state(runtime, job_id, "done")
    await idle(runtime)
    assert successes(runtime) == len(jobs)
    by_source = {
        source: metric(runtime, "receiver_pull_events_total", {"source": source})
        for source in ("webhook", "poll")
    }
    assert sum(by_source.values()) == len(jobs), by_source


async def _all_polling(sim, count) -> bool:
    return long_polls(sim) >= count


async def test_an_unknown_job_ends_not_found(pulling):
    runtime, _public, ops, _sim = pulling
    job_id = str(uuid.uuid4())
    await watch(ops, job_id)
    await watch_state(runtime, job_id, "not_found")
    (row,) = (await (await ops.get("/admin/watch?state=not_found")).json())["data"]
    assert row["job_id"] == job_id
    assert "not found" in row["last_error"]
    assert await runtime.store.list() == []


@pytest.mark.parametrize(
    "body",
    [
        {"job_ids": ["not-a-uuid"]},
        {"job_ids": [str(uuid.uuid4()), "../../etc/passwd"]},
        {"job_ids": []},
        {"job_ids": "0b6f6a52-6d43-4a57-9d4f-1f0e6a2b9c11"},
        {"job_ids": [42]},
        {"jobs": [str(uuid.uuid4())]},
        ["0b6f6a52-6d43-4a57-9d4f-1f0e6a2b9c11"],
    ],
)
async def test_a_bad_watch_request_is_refused_and_changes_nothing(pulling, body):
    runtime, _public, ops, _sim = pulling
    response = await ops.post("/admin/watch", json=body)
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["code"] == "invalid_request" and error["message"]
    assert await runtime.store.list_watches() == []


async def test_a_body_that_is_not_json_is_refused(pulling):
    _runtime, _public, ops, _sim = pulling
    response = await ops.post("/admin/watch", data=b"{nope")
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "invalid_request"


async def test_the_watch_api_needs_the_admin_token(aiohttp_client):
    settings = parse_settings(
        {
            "webhook": {"secrets": [SECRET]},
            "store": {"url": "memory://"},
            "admin": {"token": "t0ken-for-admin"},
        },
        env={},
    )
    async with Runtime(settings, role="intake") as runtime:
        ops = await aiohttp_client(runtime.ops_app())
        job_id = str(uuid.uuid4())
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            response = await ops.post("/admin/watch", json={"job_ids": [job_id]}, headers=headers)
            assert response.status == 401
            assert (await ops.get("/admin/watch", headers=headers)).status == 401
        good = {"Authorization": "Bearer t0ken-for-admin"}
        response = await ops.post("/admin/watch", json={"job_ids": [job_id]}, headers=good)
        assert response.status == 202


async def test_429_retry_after_on_the_long_poll_is_honoured(pulling):
    runtime, _public, ops, sim = pulling
    job_id = sim.add_job("logo")["job_id"]
    sim.rate_limit_fraction = 1.0
    sim.retry_after = 2
    await watch(ops, job_id)
    await wait_for(lambda: _polled(sim), what="the first long-poll")
    await asyncio.sleep(1.2)
    # The worker's backoff alone (0.05 s .. 0.2 s) would have polled several times by now.
    assert long_polls(sim) == 1
    (row,) = await runtime.store.list_watches()
    assert row.state == "watching" and "429" in (row.last_error or "")
    sim.rate_limit_fraction = 0.0
    await watch_state(runtime, job_id, "done", timeout=10)
    await delivered(runtime, job_id)
    assert long_polls(sim) == 3  # the 429, the poll after Retry-After, the worker's fetch


async def test_a_watch_that_never_finishes_ends_expired(
    aiohttp_client, tmp_path, upstream, monkeypatch
):
    # Expired watches are looked for every 5 s; every 0.2 s here, so the 1.8 s expiry is seen
    # at once instead of at the next 5 s look.
    monkeypatch.setattr(poller, "EXPIRE_EVERY_SECONDS", 0.2)
    settings = make_settings(tmp_path, upstream, wait_seconds=1, watch_expiry_hours=0.0005)
    job_id = upstream.add_job("logo", status="processing")["job_id"]
    with capture_logs() as logs:
        async with Runtime(settings) as runtime:
            ops = await aiohttp_client(runtime.ops_app())
            await watch(ops, job_id)
            await watch_state(runtime, job_id, "expired", timeout=15)
            (row,) = (await (await ops.get("/admin/watch")).json())["data"]
            assert row["state"] == "expired" and row["polls"] >= 1
            await runtime.refresh_gauges()
            assert metric(runtime, "receiver_watched_jobs", {"state": "expired"}) == 1
            polls = long_polls(upstream)
            await asyncio.sleep(1.5)
            assert long_polls(upstream) == polls  # no longer polled
    assert any(line["event"] == "watched jobs expired without finishing" for line in logs)
