"""Operating a real Runtime through an incident: a lane paused and resumed (its deliveries
wait, then all arrive, none dead), and redelivery batches through the admin API (dry run,
start, progress to done, cancel; bad input answered 400 naming the field, unknown ids 404; a
cancel into a paced lane: only the sends in flight arrive after it, the rest are dead again).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from receiver.app import Runtime
from tests.support.helpers import wait_for
from tests.support.receivers import captures, http, receiver, send, upstream

__all__ = ["captures", "receiver", "upstream"]  # fixtures, used by name


async def states_of(runtime: Runtime, ids: list[str], sink: str) -> list[tuple[str, int]]:
    out = []
    for event_id in ids:
        record = await runtime.store.get(event_id)
        assert record is not None
        [d] = [d for d in record.deliveries if d.sink == sink]
        out.append((d.state, d.attempts))
    return out


async def test_a_paused_lane_holds_its_deliveries_and_sends_them_all_after_resume(
    receiver, upstream, captures, aiohttp_client
):
    held, other = await captures(), await captures()
    runtime, client = await receiver([http("held", held), http("other", other)])
    ops = await aiohttp_client(runtime.ops_app())
    answer = await ops.post("/admin/lanes/held/pause", json={"reason": "consumer upgrade"})
    assert answer.status == 200
    lane = (await answer.json())["data"]
    assert (lane["paused"], lane["paused_until"], lane["reason"]) == (
        True,
        None,
        "consumer upgrade",
    )

    payloads = [upstream.add_job("image") for _ in range(6)]
    for payload in payloads:
        await send(client, payload)
    ids = [p["id"] for p in payloads]

    async def other_done() -> bool:
        return len(other.requests) == len(ids)

    await wait_for(other_done, 20, what="the other lane to deliver")
    await asyncio.sleep(0.5)  # many polls of the paused lane
    assert held.requests == []
    assert await states_of(runtime, ids, "held") == [("pending", 0)] * len(ids)
    await runtime.refresh_gauges()
    metric = runtime.metrics.registry.get_sample_value
    assert metric("receiver_sink_paused", {"sink": "held"}) == 1
    assert metric("receiver_sink_paused", {"sink": "other"}) == 0
    assert metric("receiver_sink_paused_seconds", {"sink": "held"}) >= 0.5
    lanes = {x["sink"]: x for x in (await (await ops.get("/admin/lanes")).json())["data"]}
    assert lanes["held"]["state"] == "paused" and lanes["held"]["backlog"] == len(ids)

    assert (await ops.post("/admin/lanes/held/resume")).status == 200

    async def held_done() -> bool:
        return await states_of(runtime, ids, "held") == [("done", 1)] * len(ids)

    await wait_for(held_done, 20, what="every held delivery to arrive")
    assert len(held.requests) == len(ids)
    await runtime.refresh_gauges()
    assert metric("receiver_sink_paused", {"sink": "held"}) == 0


async def test_a_pause_for_a_while_ends_by_itself_and_bad_input_is_refused(
    receiver, upstream, captures, aiohttp_client
):
    sink = await captures()
    runtime, client = await receiver([http("one", sink)])
    ops = await aiohttp_client(runtime.ops_app())
    # The pause begins when the receiver takes the request, so no sooner than this.
    asked = time.monotonic()
    answer = await ops.post("/admin/lanes/one/pause", json={"seconds": 1.5})
    assert (await answer.json())["data"]["paused_until"] is not None
    payload = upstream.add_job("image")
    await send(client, payload)  # fetched and due within the pause

    async def arrived() -> bool:
        return len(sink.requests) == 1

    await wait_for(arrived, 10, what="the delivery once the pause ended")
    assert sink.times[0] >= asked + 1.5  # nothing went out while the lane was paused

    for path, body, status, field in [
        ("/admin/lanes/nope/pause", {}, 404, None),
        ("/admin/lanes/nope/resume", None, 404, None),
        ("/admin/lanes/one/pause", {"seconds": -1}, 400, "seconds"),
        ("/admin/lanes/one/pause", {"seconds": "1h"}, 400, "seconds"),
        ("/admin/lanes/one/pause", {"reason": 5}, 400, "reason"),
        ("/admin/lanes/one/pause", {"for": 5}, 400, "for"),
    ]:
        answer = await ops.post(path, json=body) if body is not None else await ops.post(path)
        assert answer.status == status, path
        error = (await answer.json())["error"]
        assert error["code"] == ("not_found" if status == 404 else "invalid_request")
        if field:
            assert error["field"] == field and error["message"].startswith(field)


async def test_a_batch_through_the_admin_api(receiver, upstream, captures, aiohttp_client):
    sink = await captures()
    runtime, client = await receiver([http("one", sink)])
    ops = await aiohttp_client(runtime.ops_app())
    payloads = [upstream.add_job("image") for _ in range(5)]
    for payload in payloads:
        await send(client, payload)

    ids = [p["id"] for p in payloads]

    async def delivered() -> bool:
        return await states_of(runtime, ids, "one") == [("done", 1)] * len(ids)

    await wait_for(delivered, 20, what="the first deliveries")

    dry = await ops.post("/admin/redeliveries", json={"status": "done", "dry_run": True})
    assert dry.status == 200
    body = await dry.json()
    assert body["matched"] == 5 and len(body["sample"]) == 5 and "id" not in body
    assert (await (await ops.get("/admin/redeliveries")).json())["data"] == []

    started = await ops.post(
        "/admin/redeliveries", json={"status": "done", "sinks": ["one"], "since": "1h"}
    )
    assert started.status == 202
    batch = await started.json()
    assert (batch["matched"], batch["state"]) == (5, "running")

    async def done() -> bool:
        shown = await (await ops.get(f"/admin/redeliveries/{batch['id']}")).json()
        return shown["state"] == "done"

    await wait_for(done, 20, what="the batch done")
    shown = await (await ops.get(f"/admin/redeliveries/{batch['id']}")).json()
    assert {k: shown[k] for k in ("matched", "queued", "delivered", "failed")} == {
        "matched": 5,
        "queued": 5,
        "delivered": 5,
        "failed": 0,
    }
    assert len(sink.requests) == 10
    listed = (await (await ops.get("/admin/redeliveries")).json())["data"]
    assert [b["id"] for b in listed] == [batch["id"]]
    cancelled = await ops.post(f"/admin/redeliveries/{batch['id']}/cancel")
    assert (await cancelled.json())["state"] == "done"  # done already: left as it is

    for body, field in [
        ({"status": "lost"}, "status"),
        ({"sinks": ["nope"]}, "sinks"),
        ({"since": "yesterday"}, "since"),
        ({"since": "1h", "until": "2h"}, "until"),
        ({"job_id": 7}, "job_id"),
        ({"dry_run": "yes"}, "dry_run"),
        ({"colour": "red"}, "colour"),
    ]:
        answer = await ops.post("/admin/redeliveries", json=body)
        assert answer.status == 400, body
        error = (await answer.json())["error"]
        assert (error["code"], error["field"]) == ("invalid_request", field)
        assert field in error["message"]
    assert (await ops.post("/admin/redeliveries", data=b"[1]")).status == 400
    for answer in (
        await ops.get("/admin/redeliveries/nope"),
        await ops.post("/admin/redeliveries/nope/cancel"),
    ):
        assert answer.status == 404
        assert (await answer.json())["error"]["code"] == "not_found"


async def test_a_cancel_withdraws_what_a_paced_lane_has_not_started_to_send(
    receiver, upstream, captures, aiohttp_client
):
    sink = await captures()
    sink.status = 410  # gone: each delivery dead at its first attempt
    options = {"concurrency": 2, "rate_limit_per_second": 10, "max_attempts": 1}
    runtime, client = await receiver([http("paced", sink, **options)])
    ops = await aiohttp_client(runtime.ops_app())
    payloads = [upstream.add_job("image") for _ in range(30)]
    for payload in payloads:
        await send(client, payload)
    ids = [p["id"] for p in payloads]

    async def all_dead() -> bool:
        return await states_of(runtime, ids, "paced") == [("dead", 1)] * len(ids)

    await wait_for(all_dead, 30, what="every delivery dead")
    dead = {i: await runtime.store.get(i) for i in ids}
    refused = len(sink.times)
    sink.status = 200

    started = await ops.post("/admin/redeliveries", json={"sinks": ["paced"]})
    assert started.status == 202
    batch = await started.json()
    assert (batch["matched"], batch["queued"]) == (30, 30)

    async def some_sent() -> bool:
        return len(sink.times) >= refused + 3

    await wait_for(some_sent, 10, what="the paced lane to send a few")
    sink.hold = asyncio.Event()  # the next sends stay in flight until released

    async def lane_full() -> bool:
        return sink.in_flight == options["concurrency"]

    await wait_for(lane_full, 10, what="two sends in flight")
    answer = await ops.post(f"/admin/redeliveries/{batch['id']}/cancel")
    answered = time.monotonic()
    cancelled = await answer.json()
    sink.hold.set()
    assert cancelled["state"] == "cancelled"
    in_flight = cancelled["pending"]
    assert in_flight == options["concurrency"]  # left to complete
    assert cancelled["withdrawn"] + cancelled["delivered"] + in_flight == 30

    async def closed() -> bool:
        shown = await (await ops.get(f"/admin/redeliveries/{batch['id']}")).json()
        return shown["finished_at"] is not None

    await wait_for(closed, 10, what="the cancelled batch closed")
    await asyncio.sleep(max(0.0, answered + 2.0 - time.monotonic()))  # a window of 2 s at least
    late = [t for t in sink.times if t > answered]
    print(f"sends after the cancel: {len(late)} (in flight then: {in_flight})")
    assert len(late) <= in_flight

    shown = await (await ops.get(f"/admin/redeliveries/{batch['id']}")).json()
    sent = len(sink.times) - refused
    assert (shown["state"], shown["delivered"], shown["failed"]) == ("cancelled", sent, 0)
    assert shown["withdrawn"] == 30 - sent == cancelled["withdrawn"]
    states = await states_of(runtime, ids, "paced")
    assert sorted(states) == [("dead", 1)] * (30 - sent) + [("done", 1)] * sent
    for event_id, (state, _attempts) in zip(ids, states, strict=True):
        if state == "dead":  # as it was: the same error, attempts and times
            assert await runtime.store.get(event_id) == dead[event_id]


async def test_a_pause_and_a_resume_answer_even_when_the_backlog_cannot_be_counted(
    receiver, captures, aiohttp_client, monkeypatch
):
    """Counting a lane's backlog may time out (a million pending deliveries on a busy
    database): the pause or resume is written all the same, and its answer says what it did."""
    from receiver.errors import StoreUnavailable

    runtime, _client = await receiver([http("held", await captures())])
    ops = await aiohttp_client(runtime.ops_app())

    async def too_slow(*, now: float) -> None:
        raise StoreUnavailable("the inbox did not answer within 5 s")

    monkeypatch.setattr(runtime.store, "lane_stats", too_slow)
    answer = await ops.post("/admin/lanes/held/pause", json={"reason": "upgrade"})
    assert answer.status == 200
    lane = (await answer.json())["data"]
    assert (lane["paused"], lane["reason"], lane["counted"]) == (True, "upgrade", False)
    assert (lane["backlog"], lane["in_flight"], lane["oldest_due_seconds"]) == (None, None, None)
    assert (await runtime.store.lane_states())["held"].hold_reason == "upgrade"
    # The gauges that do not count are refreshed before those that do.
    with pytest.raises(StoreUnavailable):
        await runtime.refresh_gauges()
    paused = runtime.metrics.registry.get_sample_value("receiver_sink_paused", {"sink": "held"})
    assert paused == 1

    answer = await ops.post("/admin/lanes/held/resume")
    assert answer.status == 200
    assert (await answer.json())["data"]["paused"] is False
    assert (await runtime.store.lane_states())["held"].hold_since is None
    monkeypatch.undo()
    lane = (await (await ops.post("/admin/lanes/held/resume")).json())["data"]
    assert lane["counted"] is True and lane["backlog"] == 0
