"""Where each sink puts its delivery attempt's W3C traceparent (tracing on), and that nothing is
added with tracing off; the brokers' own tests (redis, nats) read it back from real servers."""

from __future__ import annotations

import dataclasses
import json

import pytest

from receiver.outbound.envelopes import Envelope, trace_headers
from receiver.sinks.amqp import AmqpSink
from receiver.sinks.exec import child_environment
from tests.support.peers import enriched_event
from tests.support.sinks import sink_settings

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACED = dataclasses.replace(enriched_event(), traceparent=TRACEPARENT)


def test_http_and_nats_headers_and_nothing_without_tracing():
    assert trace_headers(TRACED) == {"traceparent": TRACEPARENT}
    assert trace_headers(enriched_event()) == {}


def test_amqp_message_header():
    sink = AmqpSink(sink_settings("q", "amqp", url="amqp://127.0.0.1/", exchange="x"))
    assert sink.message(TRACED).headers["traceparent"] == TRACEPARENT
    assert "traceparent" not in (sink.message(enriched_event()).headers or {})


def test_exec_environment():
    assert child_environment({}, {}, TRACED)["TRACEPARENT"] == TRACEPARENT
    assert "TRACEPARENT" not in child_environment({}, {}, enriched_event())


@pytest.mark.parametrize("mode", ["structured", "binary"])
def test_cloudevents_carry_the_distributed_tracing_extension(mode):
    envelope = Envelope({"envelope": "cloudevents", "cloudevents_mode": mode})
    body, headers = envelope.http(TRACED)
    if mode == "structured":
        assert json.loads(body)["traceparent"] == TRACEPARENT
    else:
        assert headers["ce-traceparent"] == TRACEPARENT
    plain_body, plain_headers = envelope.http(enriched_event())
    assert "traceparent" not in plain_body.decode() and "ce-traceparent" not in plain_headers
    # The receiver's own format is unchanged: the trace travels beside it, not in it.
    assert Envelope({}).structured(TRACED) == enriched_event().to_bytes()
