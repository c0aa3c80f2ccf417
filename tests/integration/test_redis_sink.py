"""The ``redis`` sink against a real Redis: entries, dedup, trimming, restarts."""

from __future__ import annotations

import dataclasses
import json
import uuid

import pytest
import redis.asyncio as aioredis

from receiver.errors import PermanentError, TransientError
from receiver.sinks.redis import RedisStreamSink, marker_key
from tests.support.helpers import free_port
from tests.support.peers import LocalServer, enriched_event
from tests.support.services import require_service
from tests.support.sinks import opened_sinks, sink_settings

REDIS_URL = "redis://127.0.0.1:6379/0"


def redis_sink(url=REDIS_URL, **options):
    return RedisStreamSink(
        sink_settings("stream", "redis", url=url, **options), default_dedup_seconds=3600
    )


@pytest.fixture
async def redis():
    require_service("Redis", "127.0.0.1", 6379)
    client = aioredis.from_url(REDIS_URL)
    created: list[str] = []

    def stream_name() -> str:
        name = f"receiver-test:{uuid.uuid4().hex}"
        created.append(name)
        return name

    client.stream_name = stream_name
    yield client
    for name in created:
        keys = [name, *[k async for k in client.scan_iter(match=f"{name}:dedup:*")]]
        await client.delete(*keys)
    await client.aclose()


@pytest.fixture
async def opened():
    async with opened_sinks(redis_sink) as make:
        yield make


async def test_entry_fields_are_event_id_event_and_data(redis, opened):
    stream = redis.stream_name()
    sink = await opened(stream=stream)
    event = enriched_event()
    await sink.send(event)
    [(entry_id, fields)] = await redis.xrange(stream)
    assert set(fields) == {b"event_id", b"event", b"data"}
    assert fields[b"event_id"] == b"evt_1"
    assert fields[b"event"] == b"job.completed"
    assert json.loads(fields[b"data"]) == event.as_json()
    marker = marker_key(stream, "evt_1")
    assert await redis.get(marker) == entry_id
    assert 3500 < await redis.ttl(marker) <= 3600


async def test_a_redelivery_adds_no_second_entry(redis, opened):
    stream = redis.stream_name()
    sink = await opened(stream=stream)
    await sink.send(enriched_event())
    await sink.send(enriched_event())
    other = await opened(stream=stream)  # another process: the marker lives in Redis
    await other.send(enriched_event())
    await sink.send(enriched_event(event_id="evt_2"))
    entries = await redis.xrange(stream)
    assert [fields[b"event_id"] for _, fields in entries] == [b"evt_1", b"evt_2"]


async def test_dedup_can_be_turned_off(redis, opened):
    stream = redis.stream_name()
    sink = await opened(stream=stream, dedup_seconds=0)
    await sink.send(enriched_event())
    await sink.send(enriched_event())
    assert await redis.xlen(stream) == 2
    assert await redis.exists(marker_key(stream, "evt_1")) == 0


async def test_maxlen_trims_approximately(redis, opened):
    stream = redis.stream_name()
    sink = await opened(stream=stream, maxlen=10)
    for n in range(250):
        await sink.send(enriched_event(event_id=f"evt_{n}"))
    length = await redis.xlen(stream)
    assert 10 <= length < 250
    [(_, newest)] = await redis.xrevrange(stream, count=1)
    assert newest[b"event_id"] == b"evt_249"


async def test_wrong_key_type_is_dead_at_once(redis, opened):
    stream = redis.stream_name()
    await redis.set(stream, "not a stream")
    sink = await opened(stream=stream)
    with pytest.raises(PermanentError, match="WRONGTYPE"):
        await sink.send(enriched_event())


async def test_unreachable_redis_is_a_failed_attempt_and_does_not_stop_open():
    sink = redis_sink(url=f"redis://:hunter2@127.0.0.1:{free_port()}/0", stream="s")
    await sink.open()  # logged, not raised: the receiver still starts
    try:
        with pytest.raises(TransientError, match=r"redis redis://127\.0\.0\.1") as caught:
            await sink.send(enriched_event())
        assert "hunter2" not in str(caught.value)
    finally:
        await sink.close()


async def test_reconnects_after_a_restart(tmp_path):
    port = free_port()
    server = LocalServer.redis(port, tmp_path)
    server.start()
    sink = redis_sink(url=f"redis://127.0.0.1:{port}/0", stream="events")
    await sink.open()
    try:
        await sink.send(enriched_event(event_id="evt_before"))
        server.stop()
        server.start()
        # The pooled connection died with the old server: the first attempt still succeeds.
        await sink.send(enriched_event(event_id="evt_after_restart"))
        server.stop()
        with pytest.raises(TransientError):
            await sink.send(enriched_event(event_id="evt_during"))
        server.start()
        await sink.send(enriched_event(event_id="evt_during"))
        check = aioredis.from_url(f"redis://127.0.0.1:{port}/0")
        entries = await check.xrange("events")
        await check.aclose()
        # The restarted server kept nothing (no persistence): only the new entry is there.
        assert [fields[b"event_id"] for _, fields in entries] == [b"evt_during"]
    finally:
        await sink.close()
        server.stop()


async def test_cloudevents_envelope_puts_the_structured_event_in_data(redis, opened):
    from tests.support.outbound import assert_is_the_event, from_http

    stream = redis.stream_name()
    sink = await opened(stream=stream, envelope="cloudevents", cloudevents_source="urn:rx")
    event = enriched_event()
    await sink.send(event)
    [(_, fields)] = await redis.xrange(stream)
    assert fields[b"event_id"] == b"evt_1" and fields[b"event"] == b"job.completed"
    cloudevent = from_http({"Content-Type": "application/cloudevents+json"}, fields[b"data"])
    assert_is_the_event(cloudevent, event, source="urn:rx")


async def test_an_entry_carries_the_attempts_traceparent_as_a_field(redis, opened):
    stream = redis.stream_name()
    sink = await opened(stream=stream, maxlen=100)
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await sink.send(dataclasses.replace(enriched_event(), traceparent=traceparent))
    [(_entry_id, fields)] = await redis.xrange(stream)
    assert set(fields) == {b"event_id", b"event", b"data", b"traceparent"}
    assert fields[b"traceparent"] == traceparent.encode()
