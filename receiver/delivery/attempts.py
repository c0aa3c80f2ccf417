"""What a worker notes about each job fetch and delivery attempt: its steps for the event's
timeline (:mod:`receiver.observe.timeline`) and, with tracing on, its span
(:mod:`receiver.observe.tracing`, imported by whoever turns tracing on, never here).

``async with``-free: :meth:`Notes.fetch` and :meth:`Notes.delivery` are context managers around
the work; inside, the upstream calls are recorded, the span (if any) is current and
:attr:`Attempt.traceparent` names it; :meth:`Attempt.steps` ends the attempt with its outcome.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from receiver.observe.timeline import Call, attempt_step, call_steps, exemplar_of, recording
from receiver.store.records import EventRecord
from receiver.store.steps import Step

if TYPE_CHECKING:
    from receiver.observe.tracing import Tracing


@dataclass
class Attempt:
    """One fetch (``sink`` ``""``) or delivery attempt in progress."""

    sink: str
    number: int
    started_at: float
    clock: Callable[[], float]
    calls: list[Call] = field(default_factory=list)
    traceparent: str | None = None
    #: The sink's answer (an HTTP status), when it gave one.
    status: int | None = None
    outcome: str = "retry"
    error: BaseException | None = None

    @property
    def exemplar(self) -> dict[str, str] | None:
        """The metric exemplar naming this attempt's trace (tracing on, sampled)."""
        return exemplar_of(self.traceparent)

    def steps(self, outcome: str, error: BaseException | None = None) -> list[Step]:
        """End the attempt: its calls and (a delivery) the attempt itself, as timeline steps."""
        self.outcome, self.error = outcome, error
        steps = call_steps(self.calls, self.sink, self.number)
        if self.sink:
            steps.append(
                attempt_step(
                    self.sink,
                    self.number,
                    self.started_at,
                    self.clock(),
                    outcome,
                    error,
                    self.status,
                )
            )
        return steps


class Notes:
    """Makes an :class:`Attempt` for each fetch and delivery attempt of one worker."""

    def __init__(self, *, clock: Callable[[], float], tracing: Tracing | None = None) -> None:
        self._clock = clock
        self.tracing = tracing

    @contextlib.contextmanager
    def fetch(self, record: EventRecord) -> Iterator[Attempt]:
        """Fetching the event's job and assets (its enrichment attempt)."""
        attempt = Attempt("", record.enrich_attempts + 1, self._clock(), self._clock)
        with recording() as attempt.calls:
            if self.tracing is None:
                yield attempt
                return
            attributes = {
                "receiver.event.id": record.id,
                "receiver.event.name": record.event,
                "receiver.job.id": record.job_id,
                "receiver.fetch.attempt": attempt.number,
            }
            with self.tracing.continued("fetch job", record.trace, attributes) as span:
                try:
                    yield attempt
                finally:
                    self.tracing.client_spans(attempt.calls)
                    self.tracing.ended(span, attempt.outcome, attempt.error, "receiver.fetch")

    @contextlib.contextmanager
    def delivery(
        self, sink: str, sink_type: str, record: EventRecord, number: int
    ) -> Iterator[Attempt]:
        """One delivery attempt of ``sink``: its span is the one the delivery carries."""
        attempt = Attempt(sink, number, self._clock(), self._clock)
        with recording() as attempt.calls:
            if self.tracing is None:
                yield attempt
                return
            with self.tracing.delivery(sink, sink_type, number, record.id, record.trace) as span:
                attempt.traceparent = _traceparent()
                try:
                    yield attempt
                finally:
                    self.tracing.client_spans(attempt.calls)
                    self.tracing.ended(span, attempt.outcome, attempt.error)


def _traceparent() -> str | None:
    from receiver.observe.tracing import current_traceparent  # tracing is on: already imported

    return current_traceparent()
