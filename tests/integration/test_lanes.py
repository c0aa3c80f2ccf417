"""Delivery lanes in a real Runtime: webhook -> inbox -> enrichment -> one lane per sink.

A hanging or paced sink delays only itself, a lane keeps to its rate, a Retry-After pauses the
whole lane, and the job and its assets are fetched once per event whatever the number of sinks.
Peers are real aiohttp servers; the upstream is the simulator.
"""

from __future__ import annotations

import asyncio
import json
import time

from receiver.app import Runtime
from tests.support.helpers import wait_for
from tests.support.peers import Capture
from tests.support.receivers import (
    captures,
    http,
    receiver,
    send,
    settings_for,
    upstream,
)
from tests.support.upstream import rely_on

__all__ = ["captures", "receiver", "upstream"]  # fixtures, used by name

JOB_CALLS = "GET /v1/jobs/{id}"
ASSET_CALLS = "GET /v1/assets/{id}"


def slack(name: str, capture: Capture, **options):
    return {"name": name, "type": "slack", "url": capture.url, **options}


def most_in_any_window(times: list[float], seconds: float) -> int:
    return max((sum(1 for u in times if t <= u < t + seconds) for t in times), default=0)


async def done_count(runtime: Runtime, sink: str, ids: list[str]) -> int:
    count = 0
    for event_id in ids:
        record = await runtime.store.get(event_id)
        assert record is not None
        count += any(d.sink == sink and d.state == "done" for d in record.deliveries)
    return count


async def test_the_job_is_fetched_once_per_event_whatever_the_number_of_sinks(
    receiver, upstream, captures, tmp_path
):
    one, two, chat = await captures(), await captures(), await captures()
    sinks = [
        {
            "name": "files",
            "type": "download",
            "directory": str(tmp_path / "dl"),
            "allow_private_networks": True,
        },
        http("one", one),
        http("two", two),
        slack("chat", chat, rate_limit_per_second=100),
    ]
    runtime, client = await receiver(sinks)
    payloads = [upstream.add_job("image") for _ in range(8)]
    for payload in payloads:
        await send(client, payload)
    ids = [p["id"] for p in payloads]

    async def all_done() -> bool:
        records = [await runtime.store.get(i) for i in ids]
        return all(r is not None and r.state == "done" for r in records)

    await wait_for(all_done, 30, what="every event done")
    # Each asset the webhook names is fetched once too (a body may name none: the spec
    # guarantees only its id, object, event and job_id).
    named = [p.get("asset_ids") or {} for p in payloads]
    assert upstream.requests[JOB_CALLS] == len(payloads)
    assert upstream.requests[ASSET_CALLS] == sum(map(len, named)) > 0
    assert len(one.requests) == len(two.requests) == len(chat.requests) == len(payloads)
    for event_id, asset_ids in zip(ids, named, strict=True):
        record = await runtime.store.get(event_id)
        assert record is not None and record.snapshot is not None
        assert sorted(a["id"] for a in record.snapshot.assets) == sorted(asset_ids.values())


async def test_a_hanging_and_a_paced_sink_delay_only_themselves(
    receiver, upstream, captures, aiohttp_client
):
    fast, hanging, chat = await captures(), await captures(), await captures()
    hanging.hold = asyncio.Event()  # never answers
    rate = 4.0
    runtime, client = await receiver(
        [
            http("fast", fast),
            http("hanging", hanging, timeout_seconds=10),
            slack("chat", chat, rate_limit_per_second=rate),
        ]
    )
    payloads = [upstream.add_job("image") for _ in range(30)]
    started = time.monotonic()
    for payload in payloads:
        await send(client, payload)
    ids = [p["id"] for p in payloads]

    async def fast_done() -> bool:
        return await done_count(runtime, "fast", ids) == len(ids)

    await wait_for(fast_done, 20, what="the fast sink done")
    fast_seconds = time.monotonic() - started
    # The paced sink needs about 30 / 4 = 7.5 s and the hanging one never finishes: the fast
    # one did not wait for either.
    assert await done_count(runtime, "hanging", ids) == 0
    assert len(chat.requests) < len(ids)
    assert fast_seconds < len(ids) / rate / 2

    async def chat_done() -> bool:
        return await done_count(runtime, "chat", ids) == len(ids)

    ops = await aiohttp_client(runtime.ops_app())
    lanes = {lane["sink"]: lane for lane in (await (await ops.get("/admin/lanes")).json())["data"]}
    assert lanes["chat"]["rate_limit_per_second"] == rate
    assert lanes["fast"] | {"paused_since": None} == {
        "sink": "fast",
        "type": "http",
        "state": "running",
        "concurrency": 8,
        "rate_limit_per_second": 0.0,
        "backlog": 0,
        "oldest_due_seconds": 0.0,
        "in_flight": 0,
        "paused": False,
        "paused_since": None,
        "paused_until": None,
        "reason": None,
        "held_until": None,
        "circuit_open": False,
    }
    assert lanes["hanging"]["in_flight"] > 0
    await runtime.refresh_gauges()
    metric = runtime.metrics.registry.get_sample_value
    assert metric("receiver_sink_backlog", {"sink": "fast"}) == 0
    assert metric("receiver_sink_in_flight", {"sink": "hanging"}) > 0

    await wait_for(chat_done, 30, what="the paced sink done")
    # One token of burst, then `rate` a second (the send times carry a little jitter).
    assert most_in_any_window(chat.times, 1.0) <= rate + 1
    assert most_in_any_window(chat.times, 5.0) <= 5 * rate + 1
    hanging.hold.set()


async def test_a_retry_after_pauses_the_whole_lane(receiver, upstream, captures):
    chat, other = await captures(), await captures()
    chat.script = [(429, {"Retry-After": "2"})]
    # One send at a time: with more in flight, a send the lane began before the 429 came back
    # may reach the hook just after it (it cannot be recalled), and the times below would not
    # tell a held lane from a race lost by a few milliseconds.
    runtime, client = await receiver(
        [slack("chat", chat, rate_limit_per_second=0, concurrency=1), http("other", other)]
    )
    payloads = [upstream.add_job("image") for _ in range(4)]
    for payload in payloads:
        await send(client, payload)
        await asyncio.sleep(0.05)
    ids = [p["id"] for p in payloads]

    async def all_done() -> bool:
        return await done_count(runtime, "chat", ids) == len(ids)

    await wait_for(all_done, 20, what="every chat message")
    refused_at = chat.times[0]
    assert chat.answers[0] == 429
    # Nothing else went to the chat hook during the pause; the other sink went on meanwhile.
    assert all(t - refused_at >= 1.9 for t in chat.times[1:])
    assert all(t - refused_at < 1.9 for t in other.times)
    assert len(chat.requests) == len(ids) + 1


async def test_an_expired_file_url_fetches_that_asset_again_not_the_job(
    receiver, upstream, tmp_path
):
    upstream.expired_urls = True
    sink = {
        "name": "files",
        "type": "download",
        "directory": str(tmp_path / "dl"),
        "allow_private_networks": True,
    }
    runtime, client = await receiver([sink])
    rely_on(upstream, event=["asset_ids"])  # the assets the webhook names are what is refetched
    payload = upstream.add_job("image")
    await send(client, payload)

    async def refused() -> bool:
        return upstream.responses["GET /files/{name}", 403] >= 2

    await wait_for(refused, 20, what="a refused file URL")
    upstream.expired_urls = False

    async def done() -> bool:
        record = await runtime.store.get(payload["id"])
        return record is not None and record.state == "done"

    await wait_for(done, 20, what="the download")
    assert upstream.requests[JOB_CALLS] == 1
    assert upstream.requests[ASSET_CALLS] > len(payload["asset_ids"])
    assert len(list((tmp_path / "dl").rglob("*.png"))) == len(payload["asset_ids"])


async def test_deliveries_to_a_sink_no_longer_configured_are_dead(
    aiohttp_client, tmp_path, upstream, captures
):
    from receiver.store.memory import MemoryStore
    from receiver.store.records import NewEvent, Snapshot

    one = await captures()
    store = MemoryStore()
    fetched, unfetched = upstream.add_job("image"), upstream.add_job("image")
    for payload in (fetched, unfetched):
        await store.add_event(
            NewEvent(
                id=payload["id"],
                event="job.completed",
                job_id=payload["job_id"],
                body=json.dumps(payload).encode(),
                headers={},
                received_at=time.time(),
                sinks=("gone", "one"),
            )
        )
    # One event already has its job: only the sweep of unknown sinks can settle "gone".
    job = {"id": fetched["job_id"], "status": "completed"}
    await store.save_snapshot(fetched["id"], Snapshot(job, (), time.time()), now=time.time())
    settings = settings_for(tmp_path, upstream, [http("one", one)])
    async with Runtime(settings, store=store):

        async def both_settled() -> bool:
            records = [await store.get(p["id"]) for p in (fetched, unfetched)]
            return all(r is not None and r.state == "dead" for r in records)

        await wait_for(both_settled, 20, what="both events settled")
        for payload in (fetched, unfetched):
            record = await store.get(payload["id"])
            assert record is not None
            gone, kept = record.deliveries
            assert (gone.sink, gone.state, gone.last_error) == (
                "gone",
                "dead",
                "sink gone is no longer configured",
            )
            assert (kept.sink, kept.state) == ("one", "done")


async def test_a_snapshot_older_than_job_max_age_is_fetched_again(receiver, upstream, captures):
    one, two = await captures(), await captures()
    runtime, client = await receiver(
        [http("one", one), http("two", two, concurrency=1)], job_max_age_seconds=1.0
    )
    two.hold = asyncio.Event()  # the second sink's first delivery waits
    first, second = upstream.add_job("image"), upstream.add_job("image")
    await send(client, first)
    await send(client, second)

    async def one_done() -> bool:
        return len(one.requests) == 2

    await wait_for(one_done, 20, what="the first sink")
    assert upstream.requests[JOB_CALLS] == 2  # one fetch per event, shared
    await asyncio.sleep(1.2)  # both snapshots are now too old
    two.hold.set()

    async def two_done() -> bool:
        return await done_count(runtime, "two", [first["id"], second["id"]]) == 2

    await wait_for(two_done, 20, what="the second sink")
    # The delivery that ran later fetched the job again (and stored what it fetched).
    assert upstream.requests[JOB_CALLS] >= 3
    record = await runtime.store.get(second["id"])
    assert record is not None and record.snapshot is not None
    assert record.snapshot.fetched_at > record.received_at + 1.0
