"""Spans of a real OpenTelemetry SDK kept in memory, and the tree they form (tests, docs)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from receiver.config.settings import TracingSettings
from receiver.observe.tracing import Tracing


def memory_tracing(**settings: Any) -> tuple[Tracing, InMemorySpanExporter]:
    """Tracing that keeps every finished span in the returned exporter."""
    exporter = InMemorySpanExporter()
    tracing = Tracing(
        TracingSettings(enabled=True, **settings), processor=SimpleSpanProcessor(exporter)
    )
    return tracing, exporter


def span_id(span: ReadableSpan) -> str:
    assert span.context is not None
    return format(span.context.span_id, "016x")


def trace_id(span: ReadableSpan) -> str:
    assert span.context is not None
    return format(span.context.trace_id, "032x")


def parent_id(span: ReadableSpan) -> str | None:
    return None if span.parent is None else format(span.parent.span_id, "016x")


def traceparent_of(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"00-{trace_id(span)}-{span_id(span)}-{span.context.trace_flags:02x}"


def named(spans: Iterable[ReadableSpan], name: str) -> list[ReadableSpan]:
    return sorted((s for s in spans if s.name == name), key=lambda s: s.start_time or 0)


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    ident = span_id(parent)
    return sorted((s for s in spans if parent_id(s) == ident), key=lambda s: s.start_time or 0)


def tree(spans: Sequence[ReadableSpan], *, keys: Sequence[str] = ()) -> str:
    """The spans of one trace as an indented text tree: name, kind, the ``keys`` attributes."""
    ids = {span_id(s) for s in spans}
    roots = [s for s in spans if parent_id(s) not in ids]
    lines: list[str] = []

    def draw(span: ReadableSpan, prefix: str, last: bool, top: bool) -> None:
        attributes = span.attributes or {}
        shown = " ".join(f"{k}={attributes[k]}" for k in keys if k in attributes)
        kind = span.kind.name if span.kind is not None else ""
        branch = "" if top else ("└─ " if last else "├─ ")
        lines.append(f"{prefix}{branch}{span.name} [{kind}] {shown}".rstrip())
        below = children(spans, span)
        inner = prefix if top else prefix + ("   " if last else "│  ")
        for i, child in enumerate(below):
            draw(child, inner, i == len(below) - 1, False)

    for root in sorted(roots, key=lambda s: s.start_time or 0):
        draw(root, "", True, True)
    return "\n".join(lines)
