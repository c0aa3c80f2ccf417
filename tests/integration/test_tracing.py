"""Traces with the real OpenTelemetry SDK: one trace per event, from the webhook to every sink.

The spans go to an in-memory exporter; the receiver runs whole (intake, worker, lanes, the
simulator as upstream, capture servers and a command as sinks).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import uuid

import pytest
from opentelemetry.trace import SpanKind

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.config.settings import TracingSettings
from receiver.observe.tracing import add_trace_ids
from tests.support.helpers import wait_for
from tests.support.pipeline import download_sink, signed
from tests.support.pull import receiver_config, serve_simulator
from tests.support.receivers import SECRET, captures, http, send, settings_for, settled, upstream
from tests.support.traces import (
    children,
    memory_tracing,
    named,
    parent_id,
    span_id,
    trace_id,
    traceparent_of,
    tree,
)

__all__ = ["captures", "upstream"]  # fixtures, used by name

INCOMING = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
KEYS = ("receiver.outcome", "receiver.delivery.attempt", "receiver.delivery.outcome")


@pytest.fixture
async def traced(aiohttp_client, tmp_path, upstream):
    """``await traced(sinks)`` -> (runtime, client, exporter): a receiver with tracing on."""
    runtimes = []

    async def start(sinks, **worker):
        settings = settings_for(tmp_path, upstream, sinks, **worker)
        settings = dataclasses.replace(settings, tracing=TracingSettings(enabled=True))
        tracing, exporter = memory_tracing()
        runtime = Runtime(settings, tracing=tracing)
        await runtime.__aenter__()
        runtimes.append(runtime)
        return runtime, await aiohttp_client(runtime.public_app()), exporter

    yield start
    for runtime in runtimes:
        await runtime.close()


def exec_sink(path):
    command = [sys.executable, "-c", _WRITE_TRACEPARENT, str(path)]
    return {"name": "script", "type": "exec", "command": command}


_WRITE_TRACEPARENT = (
    "import os, sys; open(sys.argv[1], 'a').write(os.environ.get('TRACEPARENT', '') + '\\n')"
)


async def spans_when(exporter, count, name=None):
    """The finished spans once ``count`` of them (named ``name``) are in."""

    async def enough():
        spans = exporter.get_finished_spans()
        return len(spans if name is None else named(spans, name)) >= count

    await wait_for(enough, 10, what=f"{count} spans {name or ''}")
    return list(exporter.get_finished_spans())


async def test_a_webhook_with_three_sinks_is_one_trace(traced, upstream, captures, tmp_path):
    peer = await captures()
    traceparents = tmp_path / "traceparents"
    sinks = [http("peer", peer), exec_sink(traceparents), download_sink(tmp_path / "dl")]
    runtime, client, exporter = await traced(sinks)
    payload = upstream.add_job("image", item_name="wave")
    await send(client, payload)
    record = await settled(runtime, payload["id"])
    for sink in ("peer", "script", "files"):
        spans = await spans_when(exporter, 1, f"deliver {sink}")

    (server,) = named(spans, "POST /webhooks")
    assert server.kind == SpanKind.SERVER and server.parent is None
    attributes = dict(server.attributes or {})
    assert attributes["receiver.event.id"] == payload["id"]
    assert attributes["receiver.event.name"] == payload["event"]
    assert attributes["receiver.job.id"] == payload["job_id"]
    assert attributes["receiver.outcome"] == "accepted"
    assert attributes["http.request.method"] == "POST"
    assert attributes["http.route"] == "/webhooks"
    assert attributes["http.response.status_code"] == 200
    assert record.trace == traceparent_of(server)
    assert {trace_id(s) for s in spans} == {trace_id(server)}

    (fetch,) = named(spans, "fetch job")
    assert parent_id(fetch) == span_id(server)
    calls = children(spans, fetch)
    assert calls[0].name == "GET /jobs/{id}"
    assert all(c.kind == SpanKind.CLIENT for c in calls)
    assert all("?" not in str((c.attributes or {}).get("url.full")) for c in calls)

    kinds = {"deliver peer": SpanKind.CLIENT, "deliver script": SpanKind.INTERNAL}
    kinds["deliver files"] = SpanKind.INTERNAL
    for name, kind in kinds.items():
        (deliver,) = named(spans, name)
        assert (deliver.kind, parent_id(deliver)) == (kind, span_id(server))
        attributes = dict(deliver.attributes or {})
        assert attributes["receiver.delivery.attempt"] == 1
        assert attributes["receiver.delivery.outcome"] == "delivered"
        assert attributes["receiver.sink.name"] == name.split()[1]
    # Each delivery carried the W3C traceparent of its own attempt's span.
    (deliver_peer,) = named(spans, "deliver peer")
    assert peer.requests[0].headers["traceparent"] == traceparent_of(deliver_peer)
    (deliver_script,) = named(spans, "deliver script")
    assert traceparents.read_text().split() == [traceparent_of(deliver_script)]
    # The download's file fetches are CLIENT spans of its attempt, their signed URLs redacted.
    (deliver_files,) = named(spans, "deliver files")
    fetched = children(spans, deliver_files)
    assert fetched and {f.name for f in fetched} == {"GET {file_url}"}
    assert all(str((f.attributes or {})["url.full"]).endswith(".png") for f in fetched)
    print("\n" + tree(spans, keys=KEYS))


async def test_a_retried_delivery_is_one_span_per_attempt(traced, upstream, captures):
    peer = await captures()
    peer.fail_times(2)
    runtime, client, exporter = await traced([http("peer", peer)])
    payload = upstream.add_job("image")
    await send(client, payload)
    await settled(runtime, payload["id"])
    spans = await spans_when(exporter, 3, "deliver peer")

    attempts = named(spans, "deliver peer")
    outcomes = [
        (a.attributes["receiver.delivery.attempt"], a.attributes["receiver.delivery.outcome"])
        for a in attempts
        if a.attributes
    ]
    assert outcomes == [(1, "retry"), (2, "retry"), (3, "delivered")]
    (server,) = named(spans, "POST /webhooks")
    assert {parent_id(a) for a in attempts} == {span_id(server)}
    assert [r.headers["traceparent"] for r in peer.requests] == [
        traceparent_of(a) for a in attempts
    ]
    # The latency histograms name the trace as an exemplar (OpenMetrics).
    metrics = runtime.metrics.render(openmetrics=True).decode()
    assert f'trace_id="{trace_id(server)}"' in metrics


async def test_a_duplicate_webhook_is_a_span_of_its_own_and_fetches_nothing(
    traced, upstream, captures
):
    peer = await captures()
    runtime, client, exporter = await traced([http("peer", peer)])
    payload = upstream.add_job("image")
    await send(client, payload)
    await settled(runtime, payload["id"])
    await send(client, payload)
    spans = await spans_when(exporter, 2, "POST /webhooks")

    first, again = named(spans, "POST /webhooks")
    assert first.attributes and again.attributes
    assert first.attributes["receiver.outcome"] == "accepted"
    assert again.attributes["receiver.outcome"] == "duplicate"
    assert trace_id(first) != trace_id(again)
    await asyncio.sleep(0.2)
    assert len(named(exporter.get_finished_spans(), "fetch job")) == 1
    assert len(peer.requests) == 1


async def test_an_incoming_traceparent_is_continued(traced, upstream, captures):
    peer = await captures()
    runtime, client, exporter = await traced([http("peer", peer)])
    payload = upstream.add_job("image")
    body, headers = signed(payload, SECRET)
    response = await client.post(
        "/webhooks", data=body, headers={**headers, "traceparent": INCOMING}
    )
    assert response.status == 200
    await settled(runtime, payload["id"])
    spans = await spans_when(exporter, 1, "deliver peer")

    (server,) = named(spans, "POST /webhooks")
    assert trace_id(server) == INCOMING.split("-")[1]
    assert parent_id(server) == INCOMING.split("-")[2]
    (deliver,) = named(spans, "deliver peer")
    assert trace_id(deliver) == trace_id(server)


@pytest.mark.parametrize(
    "traceparent",
    [
        "garbage",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # an all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01\x00",
    ],
)
async def test_a_malformed_traceparent_starts_a_new_trace(traced, upstream, traceparent):
    runtime, client, exporter = await traced([])
    payload = upstream.add_job("image")
    body, headers = signed(payload, SECRET)
    headers = {**headers, "traceparent": traceparent.replace("\x00", "")}
    response = await client.post("/webhooks", data=body, headers=headers)
    assert response.status == 200
    (server,) = await spans_when(exporter, 1, "POST /webhooks")
    assert server.parent is None
    assert trace_id(server) != INCOMING.split("-")[1]
    record = await runtime.store.get(payload["id"])
    assert record is not None and record.trace == traceparent_of(server)


async def test_a_refused_webhook_is_a_span_naming_its_outcome(traced, upstream):
    _runtime, client, exporter = await traced([])
    response = await client.post("/webhooks", data=b"{}", headers={"traceparent": INCOMING})
    assert response.status == 401
    (server,) = await spans_when(exporter, 1, "POST /webhooks")
    assert server.attributes and server.attributes["receiver.outcome"] == "missing_signature"
    assert server.attributes["http.response.status_code"] == 401


async def test_log_lines_inside_a_span_carry_its_ids(traced, upstream):
    runtime, _client, _exporter = await traced([])
    assert runtime.tracing is not None
    with runtime.tracing.continued("test", INCOMING, {}) as span:
        line = add_trace_ids(None, "info", {"event": "x"})
        context = span.get_span_context()
    assert line["trace_id"] == INCOMING.split("-")[1]
    assert line["span_id"] == format(context.span_id, "016x")
    assert "trace_id" not in add_trace_ids(None, "info", {"event": "outside"})


async def test_a_pull_mode_event_starts_its_trace_at_the_poll(
    aiohttp_client, tmp_path, aiohttp_server
):
    sim = await serve_simulator(aiohttp_server, seed=11)
    config = receiver_config(tmp_path, sim, pull={"wait_seconds": 2})
    settings = parse_settings(config, env={})
    tracing, exporter = memory_tracing()
    async with Runtime(settings, tracing=tracing) as runtime:
        ops = await aiohttp_client(runtime.ops_app())
        payload = sim.add_job("image", status="processing", job_id=str(uuid.uuid4()))
        job_id = payload["job_id"]
        response = await ops.post("/admin/watch", json={"job_ids": [job_id]})
        assert response.status == 202
        await asyncio.sleep(0.3)
        sim.complete_job(job_id)
        spans = await spans_when(exporter, 1, "deliver files")

    (poll,) = named(spans, "poll job")
    assert poll.parent is None
    assert poll.attributes and poll.attributes["receiver.job.id"] == job_id
    assert poll.attributes["receiver.outcome"] == "accepted"
    (poll_call, *_) = children(spans, poll)  # the long-poll that found the outcome
    assert (poll_call.name, poll_call.kind) == ("GET /jobs/{id}", SpanKind.CLIENT)
    (deliver,) = named(spans, "deliver files")
    (fetch,) = named(spans, "fetch job")
    assert parent_id(deliver) == parent_id(fetch) == span_id(poll)
    assert trace_id(deliver) == trace_id(poll)
