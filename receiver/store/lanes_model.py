"""What delivery lanes are made of: a lane's policy and shared state, what an attempt tells it,
the deliveries a claim hands out, and the leases a worker holds.

The rules that use them live in :mod:`receiver.store.rules`.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import Literal

from receiver.store.records import DeliveryRecord, EventRecord


@dataclass(frozen=True)
class LanePolicy:
    """How fast one sink's lane may send: its token bucket and its circuit breaker.

    ``rate`` is sends per second (0 = unlimited) with a bucket of ``burst`` tokens. After
    ``circuit_failures`` consecutive failed attempts (0 = never) the lane pauses for
    ``circuit_pause`` seconds, doubling per failed probe up to ``circuit_max``.
    """

    sink: str
    rate: float = 0.0
    burst: float = 1.0
    circuit_failures: int = 0
    circuit_pause: float = 30.0
    circuit_max: float = 600.0


@dataclass(frozen=True)
class LaneState:
    """A lane's shared pacing state, one row per sink in the store.

    ``tokens`` as of ``refilled_at``; nothing is claimed before ``paused_until``; ``failures``
    counts consecutive failed attempts; ``opened_at`` is when the circuit last opened (or a probe
    began), None while it is closed. An operator's pause (:class:`LanePause`) is kept apart:
    paused since ``hold_since`` (None: not paused) until ``hold_until`` (None: until resumed),
    for ``hold_reason``; the lane's own pacing never writes it.
    """

    tokens: float
    refilled_at: float
    paused_until: float = 0.0
    failures: int = 0
    opened_at: float | None = None
    hold_since: float | None = None
    hold_until: float | None = None
    hold_reason: str | None = None

    def pause(self, now: float) -> LanePause | None:
        """The operator's pause in force at ``now``, if any (a pause ``--for`` a while ends by
        itself)."""
        if self.hold_since is None or (self.hold_until is not None and self.hold_until <= now):
            return None
        return LanePause(self.hold_since, self.hold_until, self.hold_reason)


@dataclass(frozen=True)
class LanePause:
    """A lane paused by an operator: it claims nothing from ``since`` until ``until`` (None:
    until resumed); its deliveries wait, their attempts untouched."""

    since: float
    until: float | None = None
    reason: str | None = None


LaneResultKind = Literal["success", "failure", "neutral"]


@dataclass(frozen=True)
class LaneResult:
    """What one attempt tells its lane: ``success`` closes the circuit, ``failure`` counts toward
    opening it (``neutral`` neither); ``pause`` (seconds, from a Retry-After) pauses the lane.
    ``started`` is when the attempt was claimed: failures of attempts started before the circuit
    opened are not counted again."""

    policy: LanePolicy
    kind: LaneResultKind
    started: float
    pause: float | None = None


@dataclass(frozen=True)
class Leased:
    """One delivery leased to a worker, with its event (and the event's snapshot)."""

    event: EventRecord
    delivery: DeliveryRecord


@dataclass(frozen=True)
class LaneClaim:
    """What :meth:`Store.claim_deliveries` handed out, and when asking again may find more
    (a pause's end, the next token, the next due delivery; None: nothing known).
    ``held_until``: before then the lane itself (its pause or tokens) allows nothing more,
    whatever work arrives."""

    deliveries: tuple[Leased, ...]
    retry_at: float | None
    held_until: float | None = None


@dataclass(frozen=True)
class LaneStats:
    """A lane's backlog: deliveries due and waiting (their event enriched, nobody holding them),
    the due time of the oldest, and how many are leased (in flight on some worker)."""

    backlog: int = 0
    oldest_due: float | None = None
    in_flight: int = 0


@dataclass(frozen=True)
class DeliveryKey:
    """One delivery: (event id, sink)."""

    event_id: str
    sink: str


@dataclass(frozen=True)
class Leases:
    """What a worker holds: events being enriched and deliveries being sent."""

    events: tuple[str, ...] = ()
    deliveries: tuple[DeliveryKey, ...] = field(default_factory=tuple)

    def __bool__(self) -> bool:
        return bool(self.events or self.deliveries)


def new_lease_owner() -> str:
    """A lease owner id unique to one worker or poller: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def leased(record: EventRecord, sink: str) -> Leased:
    """``record`` with its delivery to ``sink`` (which it has), as a claim hands it out."""
    return Leased(record, next(d for d in record.deliveries if d.sink == sink))
