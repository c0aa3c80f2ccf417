"""Each lane as an operator sees it, and pausing and resuming it.

One place for ``receiver lanes``, ``GET /admin/lanes`` and its pause and resume endpoints, and
the inbox page's lane buttons. A pause lives in the store's lane row (beside the rate and
circuit state), so it holds across restarts and every replica sharing the store; its deliveries
wait with their attempts untouched (:meth:`receiver.store.base.Store.pause_lane`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from receiver.config.schema import did_you_mean
from receiver.config.settings import Settings
from receiver.logs import get_logger
from receiver.store.base import Store
from receiver.store.lanes_model import LanePause, LaneState, LaneStats

log = get_logger("receiver.pauses")

#: The longest reason kept with a pause.
MAX_REASON = 500


class UnknownLane(LookupError):
    """No configured sink of that name (the message names the closest ones)."""


class BadPause(ValueError):
    """A pause's duration or reason that cannot be used (the message names the field)."""


@dataclass(frozen=True)
class LaneView:
    """One lane: its limits, its backlog across the store, and what holds it back now.

    ``paused`` by an operator (``paused_since``, ``paused_until`` None: until resumed,
    ``reason``); ``held_until`` when the lane's own pause ends (a Retry-After, an open circuit);
    ``circuit_open`` while its circuit breaker is open.
    """

    sink: str
    type: str
    concurrency: int
    rate_limit_per_second: float
    backlog: int
    oldest_due_seconds: float
    in_flight: int
    paused: bool
    paused_since: float | None
    paused_until: float | None
    reason: str | None
    held_until: float | None
    circuit_open: bool

    @property
    def state(self) -> str:
        """``paused``, ``circuit open``, ``held`` (a Retry-After) or ``running``."""
        if self.paused:
            return "paused"
        if self.circuit_open:
            return "circuit open"
        return "held" if self.held_until is not None else "running"

    def as_json(self) -> dict[str, Any]:
        return {
            "sink": self.sink,
            "type": self.type,
            "state": self.state,
            "concurrency": self.concurrency,
            "rate_limit_per_second": self.rate_limit_per_second,
            "backlog": self.backlog,
            "oldest_due_seconds": self.oldest_due_seconds,
            "in_flight": self.in_flight,
            "paused": self.paused,
            "paused_since": self.paused_since,
            "paused_until": self.paused_until,
            "reason": self.reason,
            "held_until": self.held_until,
            "circuit_open": self.circuit_open,
        }


def lane_view(
    settings: Settings, name: str, stats: LaneStats, state: LaneState | None, now: float
) -> LaneView:
    """The view of configured sink ``name``."""
    sink = next(s for s in settings.sinks if s.name == name)
    pause = state.pause(now) if state is not None else None
    held = state.paused_until if state is not None and state.paused_until > now else None
    due = stats.oldest_due
    return LaneView(
        sink=name,
        type=sink.type,
        concurrency=settings.sink_concurrency(sink),
        rate_limit_per_second=sink.rate_limit_per_second,
        backlog=stats.backlog,
        oldest_due_seconds=0.0 if due is None else max(0.0, now - due),
        in_flight=stats.in_flight,
        paused=pause is not None,
        paused_since=pause.since if pause else None,
        paused_until=pause.until if pause else None,
        reason=pause.reason if pause else None,
        held_until=held,
        circuit_open=state is not None and state.opened_at is not None,
    )


async def lane_views(store: Store, settings: Settings, *, now: float) -> list[LaneView]:
    """Every configured sink's lane, in config order."""
    stats = await store.lane_stats(now=now)
    states = await store.lane_states()
    return [
        lane_view(settings, s.name, stats.get(s.name, LaneStats()), states.get(s.name), now)
        for s in settings.sinks
    ]


def known_lane(settings: Settings, name: str) -> str:
    """``name`` if a sink of that name is configured, else UnknownLane."""
    names = [s.name for s in settings.sinks]
    if name not in names:
        listed = ", ".join(names) or "none"
        raise UnknownLane(f"no sink named {name!r}{did_you_mean(name, names)}; sinks: {listed}")
    return name


def pause_terms(seconds: Any, reason: Any) -> tuple[float | None, str | None]:
    """A pause's duration (None: until resumed) and reason, checked; BadPause names the field."""
    if seconds is not None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise BadPause("seconds: must be a number of seconds")
        if not math.isfinite(seconds) or seconds <= 0:
            raise BadPause("seconds: must be more than 0")
    if reason is not None and not isinstance(reason, str):
        raise BadPause("reason: must be a string")
    if reason is not None and len(reason) > MAX_REASON:
        raise BadPause(f"reason: at most {MAX_REASON} characters")
    return (float(seconds) if seconds is not None else None), (reason or None)


async def pause(
    store: Store,
    settings: Settings,
    name: str,
    *,
    seconds: float | None,
    reason: str | None,
    by: str,
    now: float,
) -> LanePause:
    """Pause lane ``name`` (for ``seconds``, or until resumed); UnknownLane if not configured."""
    known_lane(settings, name)
    until = now + seconds if seconds is not None else None
    held = await store.pause_lane(name, until=until, reason=reason, now=now)
    log.warning("lane paused", sink=name, until=until, reason=reason, by=by)
    return held


async def resume(
    store: Store, settings: Settings, name: str, *, by: str, now: float
) -> LanePause | None:
    """Resume lane ``name``; the pause that was in force, if any."""
    known_lane(settings, name)
    was = await store.resume_lane(name, now=now)
    log.warning("lane resumed", sink=name, was_paused=was is not None, by=by)
    return was
