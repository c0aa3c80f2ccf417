"""Noting what happens to an event while it is processed, for its timeline and its trace.

The upstream client notes each call it makes (:func:`note_call`) in the list of the
:func:`recording` around it, if any: the worker records the calls that fetch an event's job, a
lane those of a delivery attempt (a refetch of a stale snapshot), and both store them as the
event's steps (:mod:`receiver.store.steps`) with the result they belong to. Nothing here imports
OpenTelemetry; a traceparent is only read as text (:func:`exemplar_of`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

from receiver.errors import DeliveryError
from receiver.logs import redact_url
from receiver.store.steps import MAX_STEPS_PER_DELIVERY, Step

#: Calls kept by one recording: a fetch naming many assets keeps its first ones.
MAX_CALLS = MAX_STEPS_PER_DELIVERY - 1


@dataclass(frozen=True, slots=True)
class Call:
    """One upstream request: ``GET /jobs/{id}``, when, for how long, and how it ended (the HTTP
    status, or ``timeout`` / ``error``); ``url`` has no query string."""

    method: str
    endpoint: str
    url: str
    started_at: float
    seconds: float
    status: str

    @property
    def name(self) -> str:
        return f"{self.method} {self.endpoint}"

    def step(self, sink: str, attempt: int) -> Step:
        return Step(
            kind="upstream",
            sink=sink,
            name=self.name,
            attempt=attempt,
            started_at=self.started_at,
            ended_at=self.started_at + self.seconds,
            outcome=self.status,
            status=int(self.status) if self.status.isdigit() else None,
        )


_CALLS: ContextVar[list[Call] | None] = ContextVar("receiver_calls", default=None)


@contextlib.contextmanager
def recording() -> Iterator[list[Call]]:
    """Collect the upstream calls made inside (in this task and the tasks it starts)."""
    calls: list[Call] = []
    token = _CALLS.set(calls)
    try:
        yield calls
    finally:
        _CALLS.reset(token)


def note_call(call: Call) -> None:
    """Add ``call`` to the current recording (none: nothing to do)."""
    calls = _CALLS.get()
    if calls is not None and len(calls) < MAX_CALLS:
        calls.append(call)


@dataclass(slots=True)
class Noting:
    """A call being made: its ``status`` is set once known (else ``error``)."""

    status: str = "error"


@contextlib.contextmanager
def noting(method: str, endpoint: str, url: str) -> Iterator[Noting]:
    """Note the call made inside, with its time and the ``status`` set on what it yields."""
    started_at, started = time.time(), time.perf_counter()
    note = Noting()
    try:
        yield note
    finally:
        seconds = time.perf_counter() - started
        note_call(Call(method, endpoint, redact_url(url), started_at, seconds, note.status))


def call_steps(calls: Sequence[Call], sink: str, attempt: int) -> list[Step]:
    return [call.step(sink, attempt) for call in calls]


def attempt_step(
    sink: str,
    attempt: int,
    started_at: float,
    ended_at: float,
    outcome: str,
    error: BaseException | None,
    status: int | None,
) -> Step:
    """One delivery attempt as a step; the status is the sink's answer, or the error's."""
    if status is None and isinstance(error, DeliveryError):
        status = error.status
    return Step(
        kind="attempt",
        sink=sink,
        name=sink,
        attempt=attempt,
        started_at=started_at,
        ended_at=ended_at,
        outcome=outcome,
        error=None if error is None else (str(error) or type(error).__name__),
        status=status,
    )


def exemplar_of(traceparent: str | None) -> dict[str, str] | None:
    """The OpenMetrics exemplar naming the trace of ``traceparent`` when it was sampled."""
    if not traceparent:
        return None
    parts = traceparent.split("-")
    if len(parts) < 4 or not parts[3].endswith(("1", "3", "5", "7", "9", "b", "d", "f")):
        return None
    return {"trace_id": parts[1]}
