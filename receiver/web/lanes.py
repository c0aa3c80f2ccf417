"""The overview's figures: one row for each sink lane, and the events by state.

Backlog, due, oldest due and in flight (deliveries leased to a worker) come from the store, so
they cover every replica sharing it. The rate is this process's successful deliveries a minute,
from ``receiver_sink_deliveries_total``, sampled each time the overview is drawn.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from receiver.config.settings import SinkSettings
from receiver.observe.metrics import Metrics
from receiver.store.browse import InboxOverview, LaneCounts
from receiver.store.lanes_model import LanePause, LaneState
from receiver.store.records import EVENT_STATES

RATE_WINDOW_SECONDS = 300.0


@dataclass(frozen=True)
class LaneRow:
    """One sink lane as the overview shows it.

    ``waiting`` is how long the oldest due delivery has been due (None when none is due);
    ``next_due_at`` when the next one falls due, while none is due yet; ``pause`` an operator's
    pause in force; ``circuit_open`` while its circuit breaker holds it.
    """

    sink: str
    type: str
    backlog: int
    due: int
    in_flight: int
    waiting: float | None
    next_due_at: float | None
    failing: int
    per_minute: float | None
    pause: LanePause | None = None
    circuit_open: bool = False

    @property
    def stuck(self) -> bool:
        """Due work that has waited over a minute (not paused on purpose): worth a look."""
        return self.pause is None and self.waiting is not None and self.waiting > 60


class DeliveryRates:
    """Successful deliveries a minute per sink, from samples of this process's counter."""

    def __init__(self, metrics: Metrics, *, window: float = RATE_WINDOW_SECONDS) -> None:
        self._metrics = metrics
        self._window = window
        self._samples: collections.deque[tuple[float, dict[str, float]]] = collections.deque()

    def sample(self, sinks: Iterable[str], now: float) -> dict[str, float | None]:
        """Record the counters now; the rate of each sink since the oldest sample in the window
        (None until two samples at least a second apart exist)."""
        totals = {sink: self._successes(sink) for sink in sinks}
        self._samples.append((now, totals))
        while len(self._samples) > 2 and self._samples[1][0] <= now - self._window:
            self._samples.popleft()
        then, previous = self._samples[0]
        if now - then < 1.0:
            return dict.fromkeys(totals)
        return {
            sink: max(0.0, total - previous.get(sink, total)) * 60.0 / (now - then)
            for sink, total in totals.items()
        }

    def _successes(self, sink: str) -> float:
        value = self._metrics.registry.get_sample_value(
            "receiver_sink_deliveries_total", {"sink": sink, "outcome": "success"}
        )
        return value or 0.0


def gauge_counts(metrics: Metrics, now: float) -> tuple[dict[str, int], float | None] | None:
    """Events by state and the oldest pending one's receipt time, as this process's gauges
    (``receiver_inbox_events``, refreshed every few seconds) last saw them; None before their
    first refresh. Counting a million rows on every overview would cost more than the page."""
    registry = metrics.registry
    counts: dict[str, int] = {}
    for state in EVENT_STATES:
        value = registry.get_sample_value("receiver_inbox_events", {"state": state})
        if value is None:
            return None
        counts[state] = int(value)
    age = registry.get_sample_value("receiver_inbox_oldest_pending_seconds") or 0.0
    return counts, (now - age if counts["pending"] else None)


def lane_rows(
    overview: InboxOverview,
    *,
    sinks: Iterable[SinkSettings],
    states: Mapping[str, LaneState],
    rates: DeliveryRates,
    now: float,
) -> list[LaneRow]:
    """The configured sinks in config order, then any other sink the store has deliveries for
    (one removed from the config since)."""
    counts = {lane.sink: lane for lane in overview.lanes}
    types = {sink.name: sink.type for sink in sinks}
    names = [*types, *(name for name in counts if name not in types)]
    per_minute = rates.sample(names, now)
    rows = []
    for name in names:
        lane = counts.get(name, LaneCounts(name))
        due_since = lane.oldest_due_at if lane.due else None
        state = states.get(name)
        rows.append(
            LaneRow(
                sink=name,
                type=types.get(name, "not configured"),
                backlog=lane.backlog,
                due=lane.due,
                in_flight=lane.in_flight,
                waiting=None if due_since is None else max(0.0, now - due_since),
                next_due_at=lane.oldest_due_at if not lane.due else None,
                failing=lane.failing,
                per_minute=per_minute.get(name),
                pause=state.pause(now) if state is not None else None,
                circuit_open=state is not None and state.opened_at is not None,
            )
        )
    return rows
