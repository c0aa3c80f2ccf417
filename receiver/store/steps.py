"""The steps of one event's processing, as the inbox keeps them for the event's timeline.

A *step* is one upstream call made for the event (fetching its job and assets, ``kind``
``upstream``) or one delivery attempt (``kind`` ``attempt``), with its start, end, outcome, error
and HTTP status where there is one. Steps are written in the same transaction as the result
they belong to (a snapshot stored, a failed fetch, a settled attempt), at most
:data:`MAX_STEPS_PER_DELIVERY` kept per delivery (the newest; the event's own fetches count as
the delivery named ``""``), and deleted with their event. This module imports nothing else of
the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

StepKind = Literal["upstream", "attempt"]

#: Steps kept per delivery (and for the event's own fetches): the newest.
MAX_STEPS_PER_DELIVERY = 40
#: An error kept with a step is cut to this many characters.
MAX_STEP_ERROR = 500

STEP_COLUMNS = "sink, kind, name, attempt, started_at, ended_at, outcome, error, status"


@dataclass(frozen=True)
class Step:
    """One upstream call or delivery attempt of an event.

    ``sink`` is ``""`` for the event's own fetch (enrichment); ``name`` is the call
    (``GET /jobs/{id}``) or the sink; ``attempt`` the attempt it belongs to (the delivery's, or
    the fetch's); ``outcome`` ``delivered``, ``retry`` or ``dead`` for an attempt, the HTTP
    status or ``timeout``/``error`` for a call.
    """

    kind: StepKind
    sink: str
    name: str
    attempt: int
    started_at: float
    ended_at: float
    outcome: str
    error: str | None = None
    status: int | None = None

    @property
    def seconds(self) -> float:
        return max(0.0, self.ended_at - self.started_at)

    def params(self, event_id: str) -> dict[str, Any]:
        """The step as the parameters of an insert."""
        error = self.error if self.error is None else self.error[:MAX_STEP_ERROR]
        return {
            "event_id": event_id,
            "sink": self.sink,
            "kind": self.kind,
            "name": self.name,
            "attempt": self.attempt,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "outcome": self.outcome,
            "error": error,
            "status": self.status,
        }

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "sink": self.sink or None,
            "name": self.name,
            "attempt": self.attempt,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "seconds": round(self.seconds, 6),
            "outcome": self.outcome,
            "error": self.error,
            "status": self.status,
        }


def step_record(row: Sequence[Any]) -> Step:
    """A step from a row in ``STEP_COLUMNS`` order."""
    return Step(
        kind=row[1],
        sink=row[0],
        name=row[2],
        attempt=row[3],
        started_at=row[4],
        ended_at=row[5],
        outcome=row[6],
        error=row[7],
        status=row[8],
    )


def bounded(steps: Iterable[Step]) -> list[Step]:
    """The steps one write keeps: the newest :data:`MAX_STEPS_PER_DELIVERY` of each delivery."""
    by_sink: dict[str, list[Step]] = {}
    for step in steps:
        by_sink.setdefault(step.sink, []).append(step)
    return [s for group in by_sink.values() for s in group[-MAX_STEPS_PER_DELIVERY:]]


def in_order(steps: Iterable[Step]) -> list[Step]:
    """Steps as the timeline lists them: by start time."""
    return sorted(steps, key=lambda s: (s.started_at, s.ended_at))
