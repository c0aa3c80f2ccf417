"""The simulator's webhook deliveries as records, and the upstream's rules for them.

For each published event, every active subscription of the :class:`~receiver.simulator.Simulator`
whose ``events`` include it gets a :class:`Delivery`, sent by
:class:`~receiver.simulator.sender.WebhookSender`: the exact body bytes POSTed with the five
headers of :func:`receiver.signature.webhook_headers`, signed with that subscription's secret and
a fresh timestamp on every attempt. As the upstream's "Delivery and retries" rules say:

- any 2xx is delivery; any other status, a network error or no answer within 10 s is a failed
  attempt;
- a failed event is retried after waits of 1 min, 5 min, 30 min, 2 h, 6 h and 12 h (each
  multiplied by ``time_scale``), 7 attempts in all;
- each failed attempt adds 1 to the subscription's ``consecutive_failures``, a 2xx resets it to
  0, and at 100 the subscription becomes inactive: its deliveries stop, as they do when it is
  deleted.

:class:`DeliveryFaults` adds what a receiver must survive: duplicate deliveries of one event,
events held back so later ones overtake them, and a signer whose clock is off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

#: Waits before the 2nd to 7th attempt, in seconds (the spec: 1 min, 5 min, 30 min, 2 h, 6 h, 12 h).
RETRY_SCHEDULE_SECONDS: tuple[float, ...] = (60.0, 300.0, 1800.0, 7200.0, 21600.0, 43200.0)
#: The spec's limit for one attempt.
ATTEMPT_TIMEOUT_SECONDS = 10.0
#: At this many consecutive failed attempts a subscription becomes inactive.
DISABLE_AFTER_FAILURES = 100
#: How an attempt ended: the status class, no answer in time, or no answer at all.
OUTCOMES = ("2xx", "1xx", "3xx", "4xx", "5xx", "timeout", "error")

DeliveryState = Literal["scheduled", "delivered", "exhausted", "stopped"]


def retry_delays(time_scale: float = 1.0) -> tuple[float, ...]:
    """The waits before each retry, compressed by ``time_scale`` (0.001: 1 min becomes 60 ms)."""
    return tuple(seconds * time_scale for seconds in RETRY_SCHEDULE_SECONDS)


def classify(status: int) -> str:
    """``"2xx"``, ``"4xx"`` ... for an HTTP status."""
    return f"{min(max(status // 100, 1), 5)}xx"


@dataclass
class Attempt:
    """One POST of a delivery. Times are the event loop's clock (monotonic seconds)."""

    number: int
    due: float
    started: float
    signed_at: int
    outcome: str = "error"
    status: int | None = None
    finished: float = 0.0


@dataclass
class Delivery:
    """One event to one subscription (a duplicate delivery is a Delivery of its own)."""

    id: int
    event_id: str
    event_name: str
    webhook_id: str
    body: bytes
    published: float
    first_due: float
    duplicate: bool = False
    held_back: bool = False
    state: DeliveryState = "scheduled"
    stop_reason: str | None = None
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def latency(self) -> float | None:
        """Seconds from publication to the 2xx, or None if not delivered."""
        if self.state != "delivered" or not self.attempts:
            return None
        return self.attempts[-1].finished - self.published


@dataclass(frozen=True)
class DeliveryFaults:
    """What to get wrong on purpose.

    - ``duplicate_fraction``: that fraction of deliveries is sent a second time, shortly after.
    - ``out_of_order_fraction``: that fraction is held back up to ``hold_back_seconds``, so
      events published later arrive first.
    - ``clock_skew_seconds``: added to the signer's clock (the signature's ``t``); beyond the
      receiver's tolerance (300 s) every attempt is refused as stale.
    """

    duplicate_fraction: float = 0.0
    out_of_order_fraction: float = 0.0
    hold_back_seconds: float = 2.0
    clock_skew_seconds: float = 0.0


@dataclass(frozen=True)
class DeliverySummary:
    """What the sender did, as counts (:meth:`~receiver.simulator.sender.WebhookSender.summary`)."""

    events: int
    events_delivered: int  # events with at least one 2xx
    deliveries: int
    duplicates: int
    held_back: int
    states: Mapping[str, int]
    attempts: int
    outcomes: Mapping[str, int]
    latencies: tuple[float, ...]
    subscriptions: tuple[Mapping[str, Any], ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "events_delivered": self.events_delivered,
            "deliveries": self.deliveries,
            "duplicates": self.duplicates,
            "held_back": self.held_back,
            "states": dict(self.states),
            "attempts": self.attempts,
            "outcomes": dict(self.outcomes),
            "latency_seconds": latency_stats(self.latencies),
            "subscriptions": [dict(s) for s in self.subscriptions],
        }


def latency_stats(values: tuple[float, ...] | list[float]) -> dict[str, float] | None:
    """min, p50, p90, p99, max and mean of ``values`` (nearest rank), or None when empty."""
    if not values:
        return None
    ordered = sorted(values)

    def rank(p: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(p * len(ordered) + 0.5) - 1))]

    return {
        "count": len(ordered),
        "min": ordered[0],
        "p50": rank(0.50),
        "p90": rank(0.90),
        "p99": rank(0.99),
        "max": ordered[-1],
        "mean": sum(ordered) / len(ordered),
    }
