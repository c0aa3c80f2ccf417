"""The timeline on an event's page: where its time went, from what the inbox recorded.

One row for the inbox (received, stored), one for fetching the job (each upstream call), one per
delivery (each attempt, with the calls it made, such as its file downloads), on one time axis
from the webhook's receipt to the last thing done. Drawn server-side as an SVG (the page's
Content-Security-Policy allows no inline style; SVG geometry is attributes), each bar's details
on hover (its ``<title>``) and listed below it. No trace backend is needed: the steps are the
store's (:mod:`receiver.store.steps`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from receiver.events import iso_time
from receiver.store.records import EventRecord
from receiver.store.steps import Step
from receiver.web.render import format_duration

WIDTH = 1000
LABELS = 170  # the left column with each row's name
ROW = 30
AXIS = 24
MIN_BAR = 3.0  # a bar is never thinner than this (a 2 ms call in a 10 min timeline)
TICKS = 5
_OK_CALL = frozenset({"200", "201", "202", "204"})


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    css: str
    title: str


@dataclass(frozen=True)
class Label:
    x: float
    y: float
    text: str


@dataclass(frozen=True)
class Line:
    """One step as listed under the drawing."""

    row: str
    what: str
    offset: str
    seconds: str
    outcome: str
    status: int | None
    error: str | None


@dataclass(frozen=True)
class Timeline:
    width: int
    height: int
    bars: tuple[Bar, ...]
    marks: tuple[Bar, ...]
    labels: tuple[Label, ...]
    ticks: tuple[Label, ...]
    lines: tuple[Line, ...]
    total: str


def duration(seconds: float) -> str:
    """``12 ms``, ``1.25 s``, then as the rest of the page says it (``3 min 05 s``)."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    return format_duration(seconds)


def _css(step: Step) -> str:
    if step.kind == "attempt":
        return f"step attempt {step.outcome}"
    return "step call" if step.outcome in _OK_CALL else "step call failed"


def _describe(step: Step, start: float) -> str:
    head = step.name if step.kind == "upstream" else f"attempt {step.attempt}"
    status = f", HTTP {step.status}" if step.status is not None else ""
    text = f"{head}: {step.outcome}{status}, {duration(step.seconds)}"
    text += f", at +{duration(max(0.0, step.started_at - start))}"
    return text + (f" — {step.error}" if step.error else "")


def build(record: EventRecord, steps: Sequence[Step]) -> Timeline:
    """The drawing of ``record``'s timeline (its steps by start time)."""
    start = record.received_at
    ends = [start, *(s.ended_at for s in steps), *(s.started_at for s in steps)]
    stored = record.stored_at
    # Times from the store's clock (stored_at) are kept inside the span the steps cover.
    if stored is not None:
        stored = min(max(stored, start), max(ends) if steps else stored)
        ends.append(stored)
    total = max(max(ends) - start, 0.001)
    scale = (WIDTH - LABELS - 40) / total  # room for the last tick's label

    def x(at: float) -> float:
        return round(LABELS + (at - start) * scale, 1)

    rows = ["inbox", "fetch job", *(d.sink for d in record.deliveries)]
    rows += sorted({s.sink for s in steps if s.sink and s.sink not in rows})
    labels = [Label(8, AXIS + i * ROW + ROW * 0.6, name) for i, name in enumerate(rows)]
    y_of = {name: AXIS + i * ROW for i, name in enumerate(rows)}
    y_of[""] = y_of["fetch job"]

    marks = [Bar(x(start), AXIS + 4, 2, ROW - 8, "mark", f"received {iso_time(start)}")]
    if stored is not None:
        title = f"stored {iso_time(stored)} (+{duration(stored - start)})"
        marks.append(Bar(x(stored), AXIS + 4, 2, ROW - 8, "mark stored", title))
    bars: list[Bar] = []
    lines: list[Line] = []
    for step in steps:
        y = y_of[step.sink]
        width = max(MIN_BAR, round(step.seconds * scale, 1))
        # A delivery's own calls (a refetch, its file downloads) run thin under its attempt.
        own = step.sink == "" or step.kind == "attempt"
        top, height = (y + 5, ROW - 10) if own else (y + ROW - 9, 4)
        bars.append(Bar(x(step.started_at), top, width, height, _css(step), _describe(step, start)))
        lines.append(
            Line(
                row=step.sink or "fetch job",
                what=step.name if step.kind == "upstream" else f"attempt {step.attempt}",
                offset=f"+{duration(max(0.0, step.started_at - start))}",
                seconds=duration(step.seconds),
                outcome=step.outcome,
                status=step.status,
                error=step.error,
            )
        )
    ticks = [
        Label(x(start + total * i / (TICKS - 1)), AXIS - 8, f"+{duration(total * i / (TICKS - 1))}")
        for i in range(TICKS)
    ]
    return Timeline(
        width=WIDTH,
        height=AXIS + ROW * len(rows) + 4,
        bars=tuple(bars),
        marks=tuple(marks),
        labels=tuple(labels),
        ticks=tuple(ticks),
        lines=tuple(lines),
        total=duration(total),
    )
