"""Spans exported over OTLP/HTTP to a collector stand-in on loopback, decoded with the
OpenTelemetry protos: the trace arrives whole, and a collector that fails or never answers
delays no webhook and no delivery, and holds a bounded number of spans in memory."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from receiver.app import Runtime
from receiver.config.settings import TracingSettings
from receiver.observe.tracing import EXPORT_TIMEOUT_SECONDS, MAX_QUEUED_SPANS
from tests.support.helpers import wait_for
from tests.support.receivers import captures, http, send, settings_for, settled, upstream

__all__ = ["captures", "upstream"]  # fixtures, used by name


class Collector:
    """``POST /v1/traces``: decodes each request's spans; answers 200, 503, or never."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.spans: list[dict[str, object]] = []
        self.requests = 0
        self.release = asyncio.Event()  # ends the requests a "hang" collector holds

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/traces", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.mode == "hang":
            await self.release.wait()
            return web.Response(status=503)
        if self.mode == "503":
            return web.Response(status=503)
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for resource in message.resource_spans:
            service = {a.key: a.value.string_value for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                for span in scope.spans:
                    self.spans.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex() or None,
                            "kind": span.kind,
                            "service": service.get("service.name"),
                        }
                    )
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    def named(self, name: str) -> list[dict[str, object]]:
        return [s for s in self.spans if s["name"] == name]


@pytest.fixture
async def exporting(aiohttp_server, aiohttp_client, tmp_path, upstream):
    """``await exporting(collector, sinks)`` -> (runtime, client), tracing to ``collector``."""
    opened: list[tuple[Runtime, Collector]] = []

    async def start(collector, sinks):
        server = await aiohttp_server(collector.app())
        settings = settings_for(tmp_path, upstream, sinks)
        tracing = TracingSettings(
            enabled=True, endpoint=str(server.make_url("")), service_name="receiver-test"
        )
        server_settings = dataclasses.replace(settings.server, shutdown_timeout_seconds=1)
        settings = dataclasses.replace(settings, tracing=tracing, server=server_settings)
        runtime = Runtime(settings)
        await runtime.__aenter__()
        opened.append((runtime, collector))
        return runtime, await aiohttp_client(runtime.public_app())

    yield start
    for runtime, collector in opened:
        collector.release.set()
        await runtime.close()
        # Nothing of the exporter outlives the receiver's close by more than a last request in
        # flight: a thread still retrying would call the global `random` (the SDK's backoff
        # jitter) while a later test of this process runs, Hypothesis's among them.
        assert runtime.tracing is not None and runtime.tracing.shutdown_thread is not None
        thread = runtime.tracing.shutdown_thread
        await asyncio.to_thread(thread.join, EXPORT_TIMEOUT_SECONDS + 5)
        assert not thread.is_alive(), "the tracing shutdown thread still runs after close"


async def test_the_trace_reaches_an_otlp_collector(exporting, upstream, captures):
    collector, peer = Collector(), await captures()
    runtime, client = await exporting(collector, [http("peer", peer)])
    payload = upstream.add_job("image")
    await send(client, payload)
    await settled(runtime, payload["id"])

    await wait_for(lambda: _has(collector, "deliver peer"), 10, what="the deliver span exported")
    await wait_for(lambda: _has(collector, "POST /webhooks"), 10, what="the server span exported")
    _version, trace_id, span_id, _flags = peer.requests[0].headers["traceparent"].split("-")
    (deliver,) = collector.named("deliver peer")
    assert (deliver["trace_id"], deliver["span_id"]) == (trace_id, span_id)
    (server,) = collector.named("POST /webhooks")
    assert server["trace_id"] == trace_id and deliver["parent"] == server["span_id"]
    assert {s["service"] for s in collector.spans} == {"receiver-test"}
    assert collector.named("GET /jobs/{id}")


@pytest.mark.parametrize("mode", ["503", "hang"])
async def test_a_failing_collector_delays_nothing_and_holds_bounded_spans(
    exporting, upstream, captures, mode
):
    collector, peer = Collector(mode), await captures()
    runtime, client = await exporting(collector, [http("peer", peer)])
    payloads = [upstream.add_job("image") for _ in range(10)]
    started = time.monotonic()
    for payload in payloads:
        await send(client, payload)
    answered = time.monotonic() - started
    for payload in payloads:
        await settled(runtime, payload["id"])
    took = time.monotonic() - started
    assert answered < 2.0 and took < 8.0, (answered, took)
    assert len(peer.requests) == 10
    await wait_for(lambda: _asked(collector), 10, what="an export attempt")

    # Far more spans than the queue holds while the collector is of no use: the oldest go.
    assert runtime.tracing is not None
    warned = _Records()
    logging.getLogger("opentelemetry.sdk._shared_internal").addHandler(warned)
    try:
        for n in range(MAX_QUEUED_SPANS * 2):
            with runtime.tracing.continued("filler", None, {"n": n}):
                pass
    finally:
        logging.getLogger("opentelemetry.sdk._shared_internal").removeHandler(warned)
    # The SDK warns for each span it drops: the log hears of it once, not a flood.
    assert len([r for r in warned.records if "Queue full" in r.getMessage()]) <= 1
    processor = runtime.tracing.provider._active_span_processor._span_processors[0]
    queue = processor._batch_processor._queue  # the SDK's own bounded deque
    assert queue.maxlen == MAX_QUEUED_SPANS and len(queue) <= MAX_QUEUED_SPANS


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def _has(collector: Collector, name: str) -> bool:
    return bool(collector.named(name))


async def _asked(collector: Collector) -> bool:
    return collector.requests > 0
