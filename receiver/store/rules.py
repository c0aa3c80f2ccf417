"""The inbox's rules, written once: every backend runs its queries and asks these functions what
to write, so memory, SQLite and Postgres cannot drift apart.

- *Due*: a pending delivery is due once ``next_attempt_at <= now`` (never while it is None); an
  event needs enriching while ``enrich_at <= now``.
- *Leases*: a lease is free when it was never taken or ran out (``expires < now``).
- *Settle*: :func:`settle_values`; the event's state follows from its deliveries
  (:func:`event_state`).
- *Lanes*: a token bucket per sink (:func:`grant`, :func:`after_claim`) and a circuit breaker and
  Retry-After pause (:func:`after_result`), kept in one row per sink that every process shares.

Claims order candidates by ``(next_attempt_at, event_id)`` for deliveries and
``(enrich_at, seq)`` for enrichment: each backend's query sorts that way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from receiver.errors import PayloadError
from receiver.store.lanes_model import LanePolicy, LaneResult, LaneState
from receiver.store.records import DeliveryState, EventState, NewEvent, Outcome, headers_json

# Tokens are compared with this much slack, so float rounding (unix times carry ~1e-7 s of it)
# never costs a whole interval.
_EPSILON = 1e-6
#: A bucket refills this fraction of its rate: claims keep a margin (0.3 s in 10 s), so sends
#: delayed unevenly by the network or a busy machine never put more than the rate into any window
#: at the destination.
PACE = 0.97


def is_due(at: float | None, now: float) -> bool:
    """A time-gated row (delivery or enrichment) is due: it has a time and the time has come."""
    return at is not None and at <= now


def lease_free(expires_at: float | None, now: float) -> bool:
    """Nobody holds the row: never leased, released, or the lease ran out."""
    return expires_at is None or expires_at < now


@dataclass(frozen=True)
class SettleValues:
    """The columns a settle writes to its delivery row."""

    state: DeliveryState
    attempts_add: int
    next_attempt_at: float | None
    last_error: str | None


def settle_values(outcome: Outcome, now: float) -> SettleValues:
    """A pending outcome is due at its ``next_attempt_at`` (now when missing); any other state
    has no next attempt; a done delivery keeps no error; a skip is not an attempt."""
    if outcome.state == "pending":
        nxt: float | None = now if outcome.next_attempt_at is None else outcome.next_attempt_at
    else:
        nxt = None
    return SettleValues(
        state=outcome.state,
        attempts_add=1 if outcome.attempted else 0,
        next_attempt_at=nxt,
        last_error=None if outcome.state == "done" else outcome.error,
    )


def event_state(delivery_states: Iterable[str]) -> EventState:
    """``pending`` while any delivery is pending, else ``dead`` if any is dead, else ``done``."""
    states = set(delivery_states)
    if "pending" in states:
        return "pending"
    if "dead" in states:
        return "dead"
    return "done"


def event_states(
    event_ids: Iterable[str], delivery_rows: Iterable[Sequence[str]]
) -> dict[str, EventState]:
    """Each event's state from ``(event_id, delivery state)`` rows of its deliveries."""
    found: dict[str, list[str]] = {event_id: [] for event_id in event_ids}
    for event_id, state in delivery_rows:
        found[event_id].append(state)
    return {event_id: event_state(states) for event_id, states in found.items()}


# What the inbox cannot keep in an event's id, name or job id. NUL: SQLite's intake looks for
# stored ids and outcome keys by passing them as one JSON array to json_each, and SQLite's JSON
# functions end a string at an escaped NUL ("a\u0000b" comes back as "a"), so the look would miss
# such an id while the unique index, comparing the whole value, refuses it again: each retry of a
# stored event would fail instead of being a duplicate (and every other statement that takes a
# list of ids through json_each would miss it too). Postgres text cannot hold NUL at all, and in
# its group's one statement such a value would fail every event of the group. A lone surrogate
# cannot be encoded for either. Every store refuses these alike, in the caller's task.
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")


def refuse_unstorable(values: Iterable[object]) -> None:
    """Raise PayloadError if any of these (an event's id, name and job id) holds NUL or a lone
    surrogate; a value that is not text is left for the store's own refusal. For an ASCII value
    (every UUID) the test is one scan for NUL."""
    for value in values:
        if not isinstance(value, str):
            continue
        if ("\x00" in value) if value.isascii() else bool(_UNSTORABLE.search(value)):
            raise PayloadError("an event id, name or job id cannot hold NUL or a lone surrogate")


def new_event_values(has_sinks: bool, received_at: float) -> tuple[EventState, float | None]:
    """A new event's state and enrichment due time: an event for no sink is done at once."""
    return ("pending", received_at) if has_sinks else ("done", None)


def new_event_row(event: NewEvent) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """How a new event is inserted: its row (id, event, job_id, body, headers, received_at,
    state, enrichment due time, traceparent) and its sinks, each once."""
    sinks = tuple(dict.fromkeys(event.sinks))
    state, enrich_at = new_event_values(bool(sinks), event.received_at)
    row = (
        event.id,
        event.event,
        event.job_id,
        event.body,
        headers_json(event.headers),
        event.received_at,
        state,
        enrich_at,
        event.trace,
    )
    return row, sinks


def enrichment_failed(error: str, retry_at: float | None) -> Outcome:
    """What each pending delivery of an event records when fetching its job failed: an attempt
    that failed with ``error``, due again at ``retry_at`` (with the event), or dead when the
    fetch gave up (``retry_at`` None)."""
    if retry_at is None:
        return Outcome(state="dead", error=error)
    return Outcome(state="pending", error=error, next_attempt_at=retry_at)


# -- lanes --------------------------------------------------------------------------------------


def fresh_lane(policy: LanePolicy, now: float) -> LaneState:
    """A lane never seen before: a full bucket, closed circuit."""
    return LaneState(tokens=policy.burst, refilled_at=now)


@dataclass(frozen=True)
class Grant:
    """How many deliveries a lane may claim now, its state with the bucket refilled to ``now``,
    and whether the tokens (not the caller's limit) were what limited it."""

    count: int
    state: LaneState
    before: LaneState
    token_bound: bool = False
    paused_until: float | None = None


def grant(policy: LanePolicy, state: LaneState, now: float, wanted: int) -> Grant:
    """What the lane allows of ``wanted`` claims: nothing while an operator paused it or it is
    paused; one probe while its circuit is open (the pause over); else as many as it has whole
    tokens (all, unpaced)."""
    if wanted <= 0:
        return Grant(0, state, state)
    held = state.pause(now)
    if held is not None:  # until resumed: asked again at the lanes' next poll
        return Grant(0, state, state, paused_until=held.until)
    if state.paused_until > now:
        return Grant(0, state, state, paused_until=state.paused_until)
    if state.opened_at is not None:
        wanted = 1
    if policy.rate <= 0:
        return Grant(wanted, state, state)
    elapsed = max(0.0, now - state.refilled_at)
    tokens = min(policy.burst, state.tokens + elapsed * policy.rate * PACE)
    count = min(wanted, int(tokens + _EPSILON))
    refilled = replace(state, tokens=tokens, refilled_at=max(now, state.refilled_at))
    return Grant(count, refilled, state, token_bound=count < wanted)


def after_claim(
    policy: LanePolicy, granted: Grant, taken: int, now: float, lease_seconds: float
) -> tuple[LaneState, float | None]:
    """The lane's state once ``taken`` deliveries were claimed, and when it may claim again if
    its tokens ran short (None: whenever there is work). A probe keeps the lane paused until
    its result (or its lease) is in. A claim that took nothing leaves the state as it was (the
    refill is a function of time: nothing to write)."""
    if granted.paused_until is not None:
        return granted.before, granted.paused_until
    state = granted.state
    if policy.rate > 0 and taken:
        state = replace(state, tokens=state.tokens - taken)
    if taken and state.opened_at is not None:
        state = replace(state, opened_at=now, paused_until=now + lease_seconds)
        return state, state.paused_until
    retry_at = None
    if policy.rate > 0 and taken == granted.count and (granted.token_bound or state.tokens < 1):
        retry_at = now + max(0.0, 1.0 - state.tokens + _EPSILON) / (policy.rate * PACE)
    return (state if taken else granted.before), retry_at


def after_result(state: LaneState, result: LaneResult, now: float) -> LaneState | None:
    """The lane's state after one attempt's result, or None when it does not change.

    A Retry-After pauses the whole lane until then. A success closes the circuit. A failure
    counts toward ``circuit_failures`` (unless the attempt began before the circuit opened:
    those were already in flight); reaching it opens the circuit, pausing the lane for
    ``circuit_pause`` seconds, doubled for each further failure (each failed probe), capped.
    """
    policy = result.policy
    new = state
    if result.pause is not None and result.pause > 0:
        new = replace(new, paused_until=max(new.paused_until, now + result.pause))
    if result.kind == "success":
        if new.opened_at is not None:
            new = replace(new, failures=0, opened_at=None, paused_until=0.0)
        elif new.failures:
            new = replace(new, failures=0)
    elif result.kind == "failure":
        stale = new.opened_at is not None and result.started < new.opened_at
        if not stale:
            failures = new.failures + 1
            new = replace(new, failures=failures)
            threshold = policy.circuit_failures
            if threshold and failures >= threshold:
                doubled = policy.circuit_pause * 2.0 ** (failures - threshold)
                pause = max(min(policy.circuit_max, doubled), result.pause or 0.0)
                # Replaces a probe's hold (and outlasts any Retry-After of this result).
                new = replace(new, opened_at=now, paused_until=now + pause)
    return None if new == state else new


def earliest(*times: float | None) -> float | None:
    """The earliest of the given times, ignoring None."""
    known = [t for t in times if t is not None]
    return min(known) if known else None
