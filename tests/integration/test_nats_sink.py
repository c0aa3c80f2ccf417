"""The ``nats`` sink against real NATS JetStream: headers, the duplicate window, restarts."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import uuid

import nats
import pytest

from receiver.errors import TransientError
from receiver.sinks.nats import NatsSink
from tests.support.helpers import free_port, wait_for
from tests.support.jetstream import NATS_URL
from tests.support.peers import LocalServer, enriched_event
from tests.support.services import require_service
from tests.support.sinks import opened_sinks, sink_settings


def nats_sink(url=NATS_URL, **options):
    return NatsSink(sink_settings("js", "nats", url=url, **options))


@pytest.fixture
async def js(jetstream_anchor):
    """A JetStream context for the test's own checks; deletes the streams it is told of."""
    require_service("NATS", "127.0.0.1", 4222)
    client = await nats.connect(NATS_URL)
    context = client.jetstream()
    streams: list[str] = []

    def unique() -> tuple[str, str]:
        tag = uuid.uuid4().hex[:12]
        streams.append(f"RECEIVER_TEST_{tag}")
        return f"RECEIVER_TEST_{tag}", f"receiver-test.{tag}"

    context.unique = unique
    yield context
    for stream in streams:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await context.delete_stream(stream)
    await client.close()


@pytest.fixture
async def opened():
    async with opened_sinks(nats_sink) as make:
        yield make


async def test_creates_the_stream_and_publishes_with_the_event_id(js, opened):
    stream, prefix = js.unique()
    sink = await opened(
        subject=f"{prefix}.{{event}}",
        stream=stream,
        create_stream=True,
        duplicate_window_seconds=600,
    )
    info = await js.stream_info(stream)
    assert info.config.subjects == [f"{prefix}.>"]
    assert info.config.duplicate_window == 600
    event = enriched_event()
    await sink.send(event)
    message = await js.get_msg(stream, seq=1)
    assert message.subject == f"{prefix}.job.completed"
    assert message.headers["Nats-Msg-Id"] == "evt_1"
    assert message.data == event.to_bytes()
    assert json.loads(message.data) == event.as_json()


async def test_a_redelivery_is_dropped_by_the_duplicate_window(js, opened):
    stream, prefix = js.unique()
    sink = await opened(subject=f"{prefix}.events", stream=stream, create_stream=True)
    await sink.send(enriched_event())
    await sink.send(enriched_event())
    other = await opened(subject=f"{prefix}.events", stream=stream)  # another process
    await other.send(enriched_event())
    await sink.send(enriched_event(event_id="evt_2"))
    info = await js.stream_info(stream)
    assert info.state.messages == 2
    ids = [(await js.get_msg(stream, seq=n)).headers["Nats-Msg-Id"] for n in (1, 2)]
    assert ids == ["evt_1", "evt_2"]


async def test_a_consumer_receives_the_message(js, opened):
    stream, prefix = js.unique()
    sink = await opened(subject=f"{prefix}.events", stream=stream, create_stream=True)
    subscription = await js.pull_subscribe(f"{prefix}.events", durable=None, stream=stream)
    await sink.send(enriched_event())
    [message] = await subscription.fetch(1, timeout=5)
    await message.ack()
    assert message.headers["Nats-Msg-Id"] == "evt_1"
    assert json.loads(message.data)["event"]["id"] == "evt_1"


async def test_no_stream_for_the_subject_is_a_failed_attempt(js, opened):
    _stream, prefix = js.unique()
    sink = await opened(subject=f"{prefix}.nobody")
    with pytest.raises(TransientError, match="no JetStream stream stores subject"):
        await sink.send(enriched_event())


async def test_a_subject_captured_by_another_stream_is_refused(js, opened):
    stream, prefix = js.unique()
    await js.add_stream(name=stream, subjects=[f"{prefix}.>"])
    sink = await opened(subject=f"{prefix}.events", stream="SOME_OTHER_STREAM")
    with pytest.raises(TransientError, match="JetStream refused"):
        await sink.send(enriched_event())


async def test_a_stream_that_cannot_be_created_is_a_failed_attempt(js, opened):
    stream, prefix = js.unique()
    other, _ = js.unique()
    await js.add_stream(name=stream, subjects=[f"{prefix}.>"])
    # A second stream over the same subjects is refused by the server.
    sink = await opened(subject=f"{prefix}.events", stream=other, create_stream=True)
    with pytest.raises(TransientError, match=f"stream {other} could not be created"):
        await sink.send(enriched_event())


async def test_unreachable_nats_is_a_failed_attempt_and_does_not_stop_open():
    sink = nats_sink(url=f"nats://user:hunter2@127.0.0.1:{free_port()}", subject="x")
    await sink.open()
    try:
        with pytest.raises(TransientError) as caught:
            await sink.send(enriched_event())
        assert "hunter2" not in str(caught.value)
    finally:
        await sink.close()


async def test_reconnects_after_a_restart(tmp_path):
    port = free_port()
    server = LocalServer.nats(port, tmp_path)
    server.start()
    url = f"nats://127.0.0.1:{port}"
    sink = nats_sink(url=url, subject="events.all", stream="EVENTS", create_stream=True)
    await sink.open()
    try:
        await sink.send(enriched_event(event_id="evt_before"))
        server.stop()
        with pytest.raises(TransientError):
            await sink.send(enriched_event(event_id="evt_during"))
        server.start()

        async def delivered():
            try:
                await sink.send(enriched_event(event_id="evt_during"))
            except TransientError:
                return False  # JetStream may need a moment to recover its stream
            return True

        await wait_for(delivered, 30, 0.2, "a publish after the restart")
        client = await nats.connect(url)
        check = client.jetstream()
        info = await check.stream_info("EVENTS")
        ids = [
            (await check.get_msg("EVENTS", seq=n)).headers["Nats-Msg-Id"]
            for n in range(info.state.first_seq, info.state.last_seq + 1)
        ]
        await client.close()
        assert ids == ["evt_before", "evt_during"]  # the file store kept the first one
    finally:
        await sink.close()
        server.stop()


@pytest.mark.parametrize("mode", ["structured", "binary"])
async def test_cloudevents_envelope_follows_the_nats_binding(js, opened, mode):
    from tests.support.outbound import assert_is_the_event, from_nats

    stream, prefix = js.unique()
    sink = await opened(
        subject=f"{prefix}.{{event}}",
        stream=stream,
        create_stream=True,
        envelope="cloudevents",
        cloudevents_mode=mode,
    )
    event = enriched_event()
    await sink.send(event)
    await sink.send(event)  # a redelivery: still dropped by the duplicate window
    info = await js.stream_info(stream)
    assert info.state.messages == 1
    message = await js.get_msg(stream, seq=1)
    assert message.headers["Nats-Msg-Id"] == "evt_1"
    assert_is_the_event(from_nats(message.headers, message.data), event)
    if mode == "structured":
        assert message.headers["Content-Type"] == "application/cloudevents+json"
    else:
        assert message.data == event.to_bytes()
        assert message.headers["ce-type"] == "job.completed"


async def test_a_message_carries_the_attempts_traceparent_header(js, opened):
    stream, prefix = js.unique()
    sink = await opened(subject=f"{prefix}.events", stream=stream, create_stream=True)
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await sink.send(dataclasses.replace(enriched_event(), traceparent=traceparent))
    message = await js.get_msg(stream, seq=1)
    assert message.headers["traceparent"] == traceparent
    assert message.headers["Nats-Msg-Id"] == "evt_1"
