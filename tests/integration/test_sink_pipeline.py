"""Sinks inside a real Runtime: webhook -> inbox -> worker -> simulator upstream -> real peers.

Each sink's deliveries retry on their own: a refusing or unreachable peer delays only its own
sink, ``max_attempts`` ends a delivery dead (and redeliverable), ``concurrency`` caps one
sink's deliveries in flight, and the ``events`` / ``job_types`` filters decide who gets what.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid

import aio_pika
import nats
import redis.asyncio as aioredis

from receiver.signature import verify
from tests.support.helpers import free_port, wait_for
from tests.support.peers import LocalServer
from tests.support.receivers import (
    SINK_SECRET,
    captures,
    http,
    receiver,
    send,
    settled,
    upstream,
)
from tests.support.services import require_service
from tests.support.store_cases import redeliver
from tests.support.upstream import rely_on

__all__ = ["captures", "receiver", "upstream"]  # fixtures, used by name


def deliveries(record):
    return {d.sink: d for d in record.deliveries}


async def test_a_refusing_peer_is_retried_while_the_others_are_done_at_once(
    receiver, upstream, captures
):
    flaky, healthy = await captures(), await captures()
    flaky.fail_times(3)
    runtime, client = await receiver([http("flaky", flaky), http("healthy", healthy)])
    payload = upstream.add_job("image", item_name="wave")
    await send(client, payload)
    record = await settled(runtime, payload["id"])
    by_sink = deliveries(record)
    assert by_sink["healthy"].attempts == 1
    assert by_sink["flaky"].attempts == 4
    assert flaky.answers == [500, 500, 500, 200]
    assert healthy.answers == [200]
    # Every attempt carried the same event (enriched afresh), signed with the sink's secret.
    for request in flaky.requests:
        assert request.headers["Service-Event-Id"] == payload["id"]
        verify(
            secrets=[SINK_SECRET],
            body=request.body,
            header=request.headers["Service-Signature"],
            now=time.time(),
            tolerance_seconds=300,
        )
        assert json.loads(request.body)["event"]["id"] == payload["id"]
    enriched = json.loads(flaky.requests[-1].body)
    fresh = upstream.job_json(payload["job_id"])  # the job as fetched (its signed urls differ)
    assert {k: v for k, v in enriched["job"].items() if k != "urls"} == {
        k: v for k, v in fresh.items() if k != "urls"
    }
    named = payload.get("asset_ids") or {}
    assert sorted(a["id"] for a in enriched["assets"]) == sorted(named.values())
    metric = runtime.metrics.registry.get_sample_value
    assert metric("receiver_sink_deliveries_total", {"sink": "flaky", "outcome": "retry"}) == 3
    assert metric("receiver_sink_deliveries_total", {"sink": "flaky", "outcome": "success"}) == 1


async def test_redis_stopped_mid_run_delays_only_its_own_sink(
    receiver, upstream, captures, tmp_path
):
    port = free_port()
    server = LocalServer.redis(port, tmp_path)
    server.start()
    healthy = await captures()
    try:
        runtime, client = await receiver(
            [
                {
                    "name": "stream",
                    "type": "redis",
                    "url": f"redis://127.0.0.1:{port}/0",
                    "stream": "events",
                },
                http("healthy", healthy),
            ]
        )
        first = upstream.add_job("logo")
        await send(client, first)
        await settled(runtime, first["id"])

        server.stop()
        second = upstream.add_job("image")
        await send(client, second)

        async def retrying():
            record = await runtime.store.get(second["id"])
            by_sink = deliveries(record)
            return by_sink["healthy"].state == "done" and by_sink["stream"].attempts >= 2

        await wait_for(retrying, 20, what="the redis delivery failing while http is done")
        record = await runtime.store.get(second["id"])
        assert record.state == "pending"
        assert deliveries(record)["healthy"].attempts == 1
        assert "redis" in deliveries(record)["stream"].last_error

        server.start()
        record = await settled(runtime, second["id"])
        assert deliveries(record)["stream"].attempts >= 3
        check = aioredis.from_url(f"redis://127.0.0.1:{port}/0")
        entries = await check.xrange("events")
        await check.aclose()
        assert [f[b"event_id"].decode() for _, f in entries] == [second["id"]]
    finally:
        server.stop()


async def test_max_attempts_ends_dead_and_a_redelivery_recovers(receiver, upstream, captures):
    doomed, healthy = await captures(), await captures()
    doomed.status = 503
    runtime, client = await receiver(
        [http("doomed", doomed, max_attempts=2), http("healthy", healthy)], max_attempts=10
    )
    payload = upstream.add_job("image")
    await send(client, payload)
    record = await settled(runtime, payload["id"], state="dead")
    by_sink = deliveries(record)
    assert by_sink["doomed"].state == "dead" and by_sink["doomed"].attempts == 2
    assert by_sink["doomed"].last_error.startswith("gave up after 2 attempts")
    assert "HTTP 503" in by_sink["doomed"].last_error
    assert by_sink["healthy"].state == "done" and by_sink["healthy"].attempts == 1

    doomed.status = 200
    assert await redeliver(runtime.store, now=time.time()) == 1
    runtime.wake_worker()
    record = await settled(runtime, payload["id"])
    assert doomed.answers == [503, 503, 200]
    assert healthy.answers == [200]  # only the dead delivery ran again


async def test_unreachable_redis_dead_after_max_attempts_then_redelivered(
    receiver, upstream, tmp_path
):
    port = free_port()
    runtime, client = await receiver(
        [
            {
                "name": "stream",
                "type": "redis",
                "url": f"redis://127.0.0.1:{port}/0",
                "stream": "events",
                "max_attempts": 3,
            },
        ]
    )
    payload = upstream.add_job("logo")
    await send(client, payload)
    record = await settled(runtime, payload["id"], state="dead")
    assert deliveries(record)["stream"].attempts == 3

    server = LocalServer.redis(port, tmp_path)
    server.start()
    try:
        assert await redeliver(runtime.store, now=time.time()) == 1
        runtime.wake_worker()
        await settled(runtime, payload["id"])
        check = aioredis.from_url(f"redis://127.0.0.1:{port}/0")
        assert await check.xlen("events") == 1
        await check.aclose()
    finally:
        server.stop()


async def test_a_hanging_peer_times_out_and_is_retried(receiver, upstream, captures):
    slow = await captures()
    slow.hold = asyncio.Event()
    runtime, client = await receiver([http("slow", slow, timeout_seconds=0.5)])
    payload = upstream.add_job("logo")
    await send(client, payload)

    async def timed_out():
        record = await runtime.store.get(payload["id"])
        return "timed out after 0.5 s" in (record.deliveries[0].last_error or "")

    await wait_for(timed_out, 20, what="an attempt to time out")
    slow.hold.set()
    record = await settled(runtime, payload["id"])
    assert record.deliveries[0].attempts >= 2


async def test_each_sink_has_its_own_concurrency(receiver, upstream, captures):
    one, three = await captures(), await captures()
    one.hold = three.hold = asyncio.Event()
    runtime, client = await receiver(
        [http("one", one, concurrency=1), http("three", three, concurrency=3)], concurrency=8
    )
    payloads = [upstream.add_job("logo") for _ in range(5)]
    for payload in payloads:
        await send(client, payload)

    async def both_full():
        return one.in_flight == 1 and three.in_flight == 3

    await wait_for(both_full, 20, what="both sinks at their limit")
    await asyncio.sleep(0.3)  # room for a fourth (or second) request, were the limits broken
    assert one.max_in_flight == 1
    assert three.max_in_flight == 3
    one.hold.set()
    for payload in payloads:
        await settled(runtime, payload["id"])
    assert len(one.requests) == len(three.requests) == 5


async def test_event_and_job_type_filters(receiver, upstream, captures):
    failures, logos, everything = await captures(), await captures(), await captures()
    runtime, client = await receiver(
        [
            http("failures", failures, events=["job.failed"]),
            http("logos", logos, job_types=["logo"]),
            http("everything", everything),
        ]
    )
    image = upstream.add_job("image")
    failed = upstream.add_failed_job("image", error="the provider refused the prompt")
    logo = upstream.add_job("logo")
    for payload in (image, failed, logo):
        await send(client, payload)
    states = {}
    for payload in (image, failed, logo):
        record = await settled(runtime, payload["id"])
        states[payload["event"], upstream.jobs[payload["job_id"]].type] = {
            sink: (d.state, d.attempts) for sink, d in deliveries(record).items()
        }
    # The event filter applies at intake: no delivery row at all. The job type is known for
    # sure only from the fresh job, so that filter marks the row skipped, never attempted.
    assert states["job.completed", "image_generation"] == {
        "logos": ("skipped", 0),
        "everything": ("done", 1),
    }
    assert states["job.failed", "image_generation"] == {
        "failures": ("done", 1),
        "logos": ("skipped", 0),
        "everything": ("done", 1),
    }
    assert states["job.completed", "logo"] == {"logos": ("done", 1), "everything": ("done", 1)}
    assert [json.loads(r.body)["event"]["id"] for r in failures.requests] == [failed["id"]]
    assert [json.loads(r.body)["event"]["id"] for r in logos.requests] == [logo["id"]]
    assert len(everything.requests) == 3


async def test_every_sink_type_receives_the_event(
    receiver, upstream, captures, tmp_path, jetstream_anchor
):
    require_service("Redis", "127.0.0.1", 6379)
    require_service("RabbitMQ", "127.0.0.1", 5672)
    require_service("NATS", "127.0.0.1", 4222)
    tag = uuid.uuid4().hex[:10]
    stream, queue, subject = f"receiver-test:{tag}", f"receiver-test-{tag}", f"rt.{tag}.events"
    js_stream = f"RECEIVER_TEST_{tag}"
    slack, forward = await captures(), await captures()
    seen = tmp_path / "exec-seen.json"
    hook = tmp_path / "hook.py"
    hook.write_text(
        "import json, os, sys\n"
        f"json.dump({{'event_id': os.environ['RECEIVER_EVENT_ID'], "
        f"'body': json.load(sys.stdin)}}, open({str(seen)!r}, 'w'))\n"
    )
    runtime, client = await receiver(
        [
            {"name": "redis", "type": "redis", "url": "redis://127.0.0.1:6379/0", "stream": stream},
            {
                "name": "amqp",
                "type": "amqp",
                "url": "amqp://guest:guest@127.0.0.1:5672/",
                "queue": queue,
            },
            {
                "name": "nats",
                "type": "nats",
                "url": "nats://127.0.0.1:4222",
                "subject": subject,
                "stream": js_stream,
                "create_stream": True,
            },
            {"name": "slack", "type": "slack", "url": slack.url},
            http("http", forward),
            {"name": "exec", "type": "exec", "command": [sys.executable, str(hook)]},
        ]
    )
    redis_client = aioredis.from_url("redis://127.0.0.1:6379/0")
    amqp = await aio_pika.connect("amqp://guest:guest@127.0.0.1:5672/")
    nc = await nats.connect("nats://127.0.0.1:4222")
    rely_on(upstream, job=["item_name"])  # the chat text below names it
    payload = upstream.add_job("animation", item_name="dance")
    try:
        await send(client, payload)
        record = await settled(runtime, payload["id"])
        assert {d.sink: d.attempts for d in record.deliveries} == {
            "redis": 1,
            "amqp": 1,
            "nats": 1,
            "slack": 1,
            "http": 1,
            "exec": 1,
        }
        event_id = payload["id"]

        [(_, fields)] = await redis_client.xrange(stream)
        assert fields[b"event_id"].decode() == event_id
        channel = await amqp.channel()
        message = await (await channel.get_queue(queue)).get(no_ack=True)
        assert message.message_id == event_id
        js = nc.jetstream()
        stored = await js.get_msg(js_stream, seq=1)
        assert stored.headers["Nats-Msg-Id"] == event_id
        text = json.loads(slack.requests[0].body)["text"]
        assert "job.completed" in text and payload["job_id"] in text and "dance" in text
        assert forward.requests[0].headers["Service-Event-Id"] == event_id
        assert json.loads(seen.read_text())["event_id"] == event_id
        for body in (fields[b"data"], message.body, stored.data, forward.requests[0].body):
            assert json.loads(body)["event"]["id"] == event_id

        # A redelivery runs every sink again; Redis and JetStream keep one copy, the others
        # deliver again under the same event id for their consumers to drop.
        assert await redeliver(runtime.store, now=time.time(), status="any", event_id=event_id) == 6
        runtime.wake_worker()
        await settled(runtime, event_id)

        async def ran_again():
            return len(slack.requests) == 2 and len(forward.requests) == 2

        await wait_for(ran_again, 10, what="the redelivery")
        assert await redis_client.xlen(stream) == 1
        assert (await js.stream_info(js_stream)).state.messages == 1
        again = await (await channel.get_queue(queue)).get(no_ack=True)
        assert again.message_id == event_id
        assert forward.requests[1].headers["Service-Event-Id"] == event_id
    finally:
        await redis_client.delete(stream, f"{stream}:dedup:{payload['id']}")
        await redis_client.aclose()
        cleanup = await amqp.channel()
        await cleanup.queue_delete(queue)
        await amqp.close()
        await nc.jetstream().delete_stream(js_stream)
        await nc.close()
