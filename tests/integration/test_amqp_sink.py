"""The ``amqp`` sink against the real RabbitMQ: properties, confirms, returns, reconnects."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid

import aio_pika
import pytest

from receiver.errors import TransientError
from receiver.sinks.amqp import AmqpSink
from tests.support.helpers import free_port, wait_for
from tests.support.peers import enriched_event
from tests.support.services import require_service, require_tool
from tests.support.sinks import opened_sinks, sink_settings

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"


def amqp_sink(name="bus", url=AMQP_URL, **options):
    return AmqpSink(sink_settings(name, "amqp", url=url, **options))


@pytest.fixture
async def broker():
    """A connection for the test's own checks; deletes the queues and exchanges it is told of."""
    require_service("RabbitMQ", "127.0.0.1", 5672)
    connection = await aio_pika.connect(AMQP_URL)
    channel = await connection.channel()
    names = {"queues": [], "exchanges": []}

    def unique(kind: str) -> str:
        name = f"receiver-test-{uuid.uuid4().hex[:12]}"
        names[kind].append(name)
        return name

    channel.unique = unique
    channel.open_channel = connection.channel
    yield channel
    cleanup = await connection.channel()
    for queue in names["queues"]:
        await cleanup.queue_delete(queue)
    for exchange in names["exchanges"]:
        await cleanup.exchange_delete(exchange)
    await connection.close()


@pytest.fixture
async def opened():
    async with opened_sinks(amqp_sink) as make:
        yield make


async def get_messages(channel, queue_name, count):
    queue = await channel.get_queue(queue_name, ensure=True)
    messages = []

    async def got_all():
        message = await queue.get(fail=False, no_ack=True)
        if message is not None:
            messages.append(message)
        return len(messages) >= count

    await wait_for(got_all, 10, what=f"{count} messages on {queue_name}")
    return messages


async def test_persistent_message_with_event_id_on_a_bound_queue(broker, opened):
    exchange, queue = broker.unique("exchanges"), broker.unique("queues")
    sink = await opened(exchange=exchange, queue=queue, binding_key="job.*")
    event = enriched_event()
    await sink.send(event)
    [message] = await get_messages(broker, queue, 1)
    assert message.body == event.to_bytes()
    assert json.loads(message.body) == event.as_json()
    assert message.message_id == "evt_1"
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert message.content_type == "application/json"
    assert message.type == "job.completed"
    assert message.routing_key == "job.completed"
    assert message.exchange == exchange
    assert message.headers == {
        "event": "job.completed",
        "job_id": "job_1",
        "job_type": "image_generation",
    }
    # The broker refuses to redeclare the queue as non-durable: it was declared durable.
    probe = await broker.open_channel()
    with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
        await probe.declare_queue(queue, durable=False)


async def test_default_exchange_routes_to_the_queue_by_name(broker, opened):
    queue = broker.unique("queues")
    sink = await opened(queue=queue)
    await sink.send(enriched_event())
    await sink.send(enriched_event())  # a redelivery: same message_id, the consumer dedups
    messages = await get_messages(broker, queue, 2)
    assert [m.message_id for m in messages] == ["evt_1", "evt_1"]
    assert messages[0].routing_key == queue


async def test_routing_key_names_the_job_type(broker, opened):
    exchange, queue = broker.unique("exchanges"), broker.unique("queues")
    sink = await opened(
        exchange=exchange,
        exchange_type="direct",
        routing_key="jobs.{job_type}",
        queue=queue,
        binding_key="jobs.image_generation",
    )
    await sink.send(enriched_event())
    [message] = await get_messages(broker, queue, 1)
    assert message.routing_key == "jobs.image_generation"


async def test_an_unroutable_message_is_a_failed_attempt(broker, opened):
    exchange = broker.unique("exchanges")
    sink = await opened(exchange=exchange)  # no queue bound
    with pytest.raises(TransientError, match="no queue is bound"):
        await sink.send(enriched_event())
    quiet = await opened(name="quiet", exchange=exchange, mandatory=False)
    await quiet.send(enriched_event())  # the operator chose to let the broker drop it


async def test_a_message_the_broker_refuses_is_not_counted_as_delivered(broker, opened):
    exchange, queue = broker.unique("exchanges"), broker.unique("queues")
    # A full queue that rejects new messages makes RabbitMQ answer the publish with a nack.
    declared = await broker.declare_queue(
        queue, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
    )
    sink = await opened(exchange=exchange)
    await declared.bind(exchange, "#")
    await sink.send(enriched_event(event_id="evt_1"))
    with pytest.raises(TransientError, match="refused the message"):
        await sink.send(enriched_event(event_id="evt_2"))
    [message] = await get_messages(broker, queue, 1)
    assert message.message_id == "evt_1"
    await sink.send(enriched_event(event_id="evt_2"))  # room again: the retry is confirmed


async def test_unreachable_broker_is_a_failed_attempt_and_does_not_stop_open():
    sink = amqp_sink(url=f"amqp://guest:hunter2@127.0.0.1:{free_port()}/", queue="q")
    await sink.open()
    try:
        with pytest.raises(TransientError) as caught:
            await sink.send(enriched_event())
        assert "hunter2" not in str(caught.value)
        assert "amqp amqp://127.0.0.1" in str(caught.value)
    finally:
        await sink.close()


def close_broker_connections(name: str) -> int:
    """Have RabbitMQ itself drop every connection whose client named itself ``name``."""
    listing = subprocess.run(
        ["rabbitmqctl", "list_connections", "-q", "pid", "client_properties"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    wanted = f'{{"connection_name","{name}"}}'
    pids = [line.split("\t")[0] for line in listing.splitlines() if wanted in line]
    for pid in pids:
        subprocess.run(
            ["rabbitmqctl", "close_connection", pid, "closed by the test"],
            capture_output=True,
            timeout=60,
            check=True,
        )
    return len(pids)


async def test_reconnects_after_the_broker_drops_the_connection(broker, opened):
    # rabbitmqctl comes with the RabbitMQ server the test already talks to.
    require_tool("rabbitmqctl", installed_by="the rabbitmq-server package")
    queue = broker.unique("queues")
    name = f"drop-{uuid.uuid4().hex[:8]}"
    sink = await opened(name=name, queue=queue)
    await sink.send(enriched_event(event_id="evt_before"))
    closed = await asyncio.to_thread(close_broker_connections, f"receiver sink {name}")
    assert closed == 1

    async def sent_after_drop():
        try:
            await sink.send(enriched_event(event_id="evt_after"))
        except TransientError:
            return False  # the attempt that finds the connection gone; the next one reconnects
        return True

    await wait_for(sent_after_drop, 15, what="a publish after the drop")
    messages = await get_messages(broker, queue, 2)
    assert [m.message_id for m in messages] == ["evt_before", "evt_after"]


@pytest.mark.parametrize("mode", ["structured", "binary"])
async def test_cloudevents_envelope_follows_the_amqp_binding(broker, opened, mode):
    from tests.support.outbound import assert_is_the_event, from_amqp

    queue = broker.unique("queues")
    sink = await opened(queue=queue, envelope="cloudevents", cloudevents_mode=mode)
    event = enriched_event()
    await sink.send(event)
    [message] = await get_messages(broker, queue, 1)
    assert_is_the_event(from_amqp(message.content_type, message.headers, message.body), event)
    assert message.message_id == "evt_1" and message.type == "job.completed"
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    if mode == "structured":
        assert message.content_type == "application/cloudevents+json"
        assert not any(name.startswith("cloudEvents") for name in message.headers)
    else:
        assert message.content_type == "application/json"
        assert message.body == event.to_bytes()
        assert message.headers["cloudEvents_id"] == "evt_1"
        assert message.headers["cloudEvents_subject"] == "job_1"
