"""OpenTelemetry traces: one trace per event, from the webhook to every sink (docs/tracing.md).

Imported only when ``[tracing] enabled = true`` (the ``receiver[otel]`` extra); with tracing off
nothing of OpenTelemetry is imported, and intake runs its plain handler.

- The webhook request is a SERVER span (:meth:`Tracing.server_span`), the child of a valid
  incoming ``traceparent``; its W3C context is stored with the event (``NewEvent.trace``).
- After the store, the event's processing continues that stored context
  (:meth:`Tracing.continued`), in any process and after a restart: the job fetch, each upstream
  call as a CLIENT span made from the call's own timing (:meth:`Tracing.client_spans`), and one
  ``deliver {sink}`` span per attempt (:meth:`Tracing.delivery`), CLIENT for http and slack,
  PRODUCER for redis, amqp and nats, INTERNAL for download and exec.
- A pull-mode event's trace starts at the poll that found its job's outcome
  (:meth:`Tracing.store_polled`).

Spans are exported over OTLP/HTTP by a batch processor on its own thread, with a bounded queue
(the oldest spans are dropped when it is full): a collector that is down or slow never delays a
webhook or a delivery, and never grows memory without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from receiver import __version__
from receiver.config.settings import TracingSettings
from receiver.logs import add_processor, redact_query_strings, remove_processor
from receiver.observe.timeline import Call
from receiver.store.base import Store
from receiver.store.records import NewEvent

#: Spans waiting for the exporter at most (then the oldest are dropped), and sent per request.
MAX_QUEUED_SPANS = 2048
EXPORT_BATCH = 512
EXPORT_DELAY_MILLIS = 1000
#: Each export request's time limit (its retries stop there too).
EXPORT_TIMEOUT_SECONDS = 5.0
TRACES_PATH = "/v1/traces"

SINK_KINDS = {
    "http": SpanKind.CLIENT,
    "slack": SpanKind.CLIENT,
    "discord": SpanKind.CLIENT,
    "teams": SpanKind.CLIENT,
    "redis": SpanKind.PRODUCER,
    "amqp": SpanKind.PRODUCER,
    "nats": SpanKind.PRODUCER,
}
DELIVERED = "delivered"

_PROPAGATOR = TraceContextTextMapPropagator()


def exporter_for(settings: TracingSettings) -> SpanExporter | None:
    """The OTLP/HTTP exporter to ``endpoint``, else to the ``OTEL_EXPORTER_OTLP_*`` endpoint
    variables, else none (spans are made, for the ids in the logs, and not sent)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if settings.endpoint:
        endpoint = settings.endpoint.rstrip("/") + TRACES_PATH
        return OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_SECONDS)
    if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    ):
        return OTLPSpanExporter(timeout=EXPORT_TIMEOUT_SECONDS)
    return None


def batch_processor(exporter: SpanExporter) -> BatchSpanProcessor:
    return BatchSpanProcessor(
        exporter,
        max_queue_size=MAX_QUEUED_SPANS,
        schedule_delay_millis=EXPORT_DELAY_MILLIS,
        max_export_batch_size=EXPORT_BATCH,
        export_timeout_millis=EXPORT_TIMEOUT_SECONDS * 1000,
    )


def context_of(traceparent: str | None) -> Context | None:
    """The span context a stored traceparent names (None: start a new trace)."""
    if not traceparent:
        return None
    return _PROPAGATOR.extract({"traceparent": traceparent})


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span (None when there is none)."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def _nanos(seconds: float) -> int:
    return int(seconds * 1_000_000_000)


def add_trace_ids(
    _logger: Any, _name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: ``trace_id`` and ``span_id`` of the current span, if any."""
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event_dict.setdefault("trace_id", format(context.trace_id, "032x"))
        event_dict.setdefault("span_id", format(context.span_id, "016x"))
    return event_dict


class Tracing:
    """The process's tracer provider and the helpers the receiver calls.

    ``processor`` replaces the OTLP batch processor (tests pass an in-memory exporter's).
    """

    def __init__(
        self, settings: TracingSettings, *, processor: SpanProcessor | None = None
    ) -> None:
        name = os.environ.get("OTEL_SERVICE_NAME") or settings.service_name
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": name, "service.version": __version__}),
            sampler=ParentBased(root=TraceIdRatioBased(settings.sample_ratio)),
        )
        self._exporter: SpanExporter | None = None
        if processor is None:
            self._exporter = exporter_for(settings)
            processor = batch_processor(self._exporter) if self._exporter is not None else None
        self._processor = processor
        #: The thread :meth:`shutdown` sends the last spans from (None before it is called).
        self.shutdown_thread: threading.Thread | None = None
        if processor is not None:
            self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("receiver", __version__)
        sdk_log = logging.getLogger(_SDK_QUEUE_LOGGER)
        if _SPARSE not in sdk_log.filters:
            sdk_log.addFilter(_SPARSE)

    def start_logging(self) -> None:
        """Log lines made inside a span carry its ``trace_id`` and ``span_id``."""
        add_processor(add_trace_ids)

    async def shutdown(self, timeout: float) -> None:
        """Send what is queued, for ``timeout`` seconds at most, in a thread of its own (a
        collector that never answers cannot hold the process). Past the timeout the rest is
        given up: the exporter is stopped, so it makes no further attempt (the SDK would
        otherwise retry each remaining batch for its whole export timeout, in the background)."""
        remove_processor(add_trace_ids)
        done = asyncio.get_running_loop().create_future()

        def run() -> None:
            with contextlib.suppress(Exception):
                self.provider.shutdown()
            with contextlib.suppress(RuntimeError):
                done.get_loop().call_soon_threadsafe(_resolve, done)

        self.shutdown_thread = threading.Thread(target=run, name="tracing-shutdown", daemon=True)
        self.shutdown_thread.start()
        try:
            await asyncio.wait_for(asyncio.shield(done), timeout)
        except TimeoutError:
            if self._exporter is not None:
                with contextlib.suppress(Exception):
                    self._exporter.shutdown()

    # -- the webhook request ---------------------------------------------------------------------

    @contextlib.contextmanager
    def server_span(
        self, headers: Mapping[str, str], attributes: Mapping[str, Any], name: str
    ) -> Iterator[Span]:
        """The request's SERVER span, current inside; the child of a valid ``traceparent``
        header (a malformed one is ignored: a new trace)."""
        parent = _PROPAGATOR.extract(headers)
        with self._current(name, parent, SpanKind.SERVER, attributes) as span:
            yield span

    def _current(
        self, name: str, parent: Context | None, kind: SpanKind, attributes: Mapping[str, Any]
    ) -> contextlib.AbstractContextManager[Span]:
        """A new span, current inside; exceptions are the caller's to describe."""
        return self.tracer.start_as_current_span(
            name,
            context=parent,
            kind=kind,
            attributes=dict(attributes),
            record_exception=False,
            set_status_on_exception=False,
        )

    # -- after the store -------------------------------------------------------------------------

    @contextlib.contextmanager
    def continued(
        self,
        name: str,
        traceparent: str | None,
        attributes: Mapping[str, Any],
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> Iterator[Span]:
        """A span of the event's trace (the stored ``traceparent``), current inside."""
        with self._current(name, context_of(traceparent), kind, attributes) as span:
            yield span

    @contextlib.contextmanager
    def delivery(
        self, sink: str, sink_type: str, attempt: int, event_id: str, traceparent: str | None
    ) -> Iterator[Span]:
        """One delivery attempt's ``deliver {sink}`` span, current inside."""
        attributes = {
            "receiver.sink.name": sink,
            "receiver.sink.type": sink_type,
            "receiver.delivery.attempt": attempt,
            "receiver.event.id": event_id,
        }
        kind = SINK_KINDS.get(sink_type, SpanKind.INTERNAL)
        with self.continued(f"deliver {sink}", traceparent, attributes, kind) as span:
            yield span

    @staticmethod
    def ended(
        span: Span, outcome: str, error: BaseException | None, key: str = "receiver.delivery"
    ) -> None:
        """Note how an attempt (or a fetch: ``key`` ``receiver.fetch``) ended on its span."""
        span.set_attribute(f"{key}.outcome", outcome)
        if error is not None:
            span.set_attribute("error.type", type(error).__name__)
            span.set_status(Status(StatusCode.ERROR, str(error)[:300]))

    def client_spans(self, calls: Sequence[Call]) -> None:
        """Calls (upstream API, files) as CLIENT spans of the current span, from their own
        timing."""
        for call in calls:
            self._client_span(call, None)

    def _client_span(self, call: Call, context: Context | None) -> None:
        attributes: dict[str, Any] = {
            "http.request.method": call.method,
            "url.full": redact_query_strings(call.url),
            "url.template": call.endpoint,
        }
        if call.status.isdigit():
            attributes["http.response.status_code"] = int(call.status)
        span = self.tracer.start_span(
            call.name,
            context=context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=_nanos(call.started_at),
        )
        if not call.status.isdigit() or int(call.status) >= 400:
            span.set_attribute("error.type", call.status)
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=_nanos(call.started_at + call.seconds))

    @staticmethod
    async def store_event(store: Store, event: NewEvent) -> bool:
        """``store.add_event`` for an event made inside the current span: stamped with its
        context, the span with the event's ids and ``receiver.outcome``."""
        span = trace.get_current_span()
        span.set_attributes(
            {
                "receiver.event.id": event.id,
                "receiver.event.name": event.event,
                "receiver.job.id": event.job_id,
            }
        )
        added = await store.add_event(dataclasses.replace(event, trace=current_traceparent()))
        span.set_attribute("receiver.outcome", "accepted" if added else "duplicate")
        return added

    async def store_polled(self, store: Store, event: NewEvent, calls: Sequence[Call]) -> bool:
        """Store a pull-mode event as the root of its trace: the poll that found the job's
        outcome (from its first call, with its ``calls`` as CLIENT spans)."""
        started_at = calls[0].started_at if calls else time.time()
        span = self.tracer.start_span(
            "poll job",
            context=Context(),
            kind=SpanKind.INTERNAL,
            attributes={"receiver.event.source": event.source},
            start_time=_nanos(started_at),
        )
        with trace.use_span(span, end_on_exit=True, record_exception=False):
            parent = trace.set_span_in_context(span)
            for call in calls:
                self._client_span(call, parent)
            return await self.store_event(store, event)


class _Sparse(logging.Filter):
    """Lets one record through per ``seconds`` of each message: the SDK warns once for every
    span it drops from a full queue, which a collector that is down would make a flood."""

    def __init__(self, seconds: float = 60.0) -> None:
        super().__init__()
        self._seconds = seconds
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now - self._last.get(record.msg, -self._seconds) < self._seconds:
            return False
        if len(self._last) > 100:
            self._last.clear()
        self._last[str(record.msg)] = now
        return True


_SDK_QUEUE_LOGGER = "opentelemetry.sdk._shared_internal"
_SPARSE = _Sparse()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
