"""The inbox rules every store backend applies: pure functions, no store, no clock."""

from __future__ import annotations

import pytest

from receiver.delivery.lanes import burst_for, lane_result
from receiver.errors import NotReady, PermanentError, TransientError, UrlRefused
from receiver.store import rules
from receiver.store.lanes_model import LanePolicy, LaneResult, LaneState
from receiver.store.records import Outcome

T0 = 1_700_000_000.0


def test_due_and_lease_rules() -> None:
    assert rules.is_due(T0, T0) and not rules.is_due(T0 + 1, T0)
    assert not rules.is_due(None, T0)  # no time, never due (the SQL agrees: NULL <= x is not true)
    assert rules.lease_free(None, T0) and rules.lease_free(T0 - 1, T0)
    assert not rules.lease_free(T0, T0)


def test_settle_values() -> None:
    retry = rules.settle_values(Outcome("pending", error="x"), T0)
    assert (retry.state, retry.attempts_add, retry.next_attempt_at, retry.last_error) == (
        "pending",
        1,
        T0,  # a pending outcome without a time is due now
        "x",
    )
    done = rules.settle_values(Outcome("done", error="ignored", next_attempt_at=T0 + 5), T0)
    assert (done.next_attempt_at, done.last_error) == (None, None)
    assert rules.settle_values(Outcome("skipped", attempted=False), T0).attempts_add == 0


@pytest.mark.parametrize(
    "states,expected",
    [
        ((), "done"),
        (("done", "skipped"), "done"),
        (("dead", "done"), "dead"),
        (("dead", "pending"), "pending"),
    ],
)
def test_event_state(states: tuple[str, ...], expected: str) -> None:
    assert rules.event_state(states) == expected


def test_enrichment_failures_are_attempts_of_every_pending_delivery() -> None:
    assert rules.enrichment_failed("boom", T0 + 5) == Outcome(
        "pending", error="boom", next_attempt_at=T0 + 5
    )
    assert rules.enrichment_failed("gone", None) == Outcome("dead", error="gone")


def test_token_bucket_refills_at_the_rate_up_to_the_burst() -> None:
    policy = LanePolicy("s", rate=2.0, burst=3.0)
    state = rules.fresh_lane(policy, T0)
    granted = rules.grant(policy, state, T0, 10)
    assert granted.count == 3 and granted.token_bound
    state, retry_at = rules.after_claim(policy, granted, 3, T0, 60)
    # A hair slower than the rate: the next token after 0.5 s / PACE.
    assert state.tokens == pytest.approx(0) and retry_at == pytest.approx(T0 + 0.5 / rules.PACE)
    assert rules.grant(policy, state, T0 + 0.5, 10).count == 0
    # Nothing taken: nothing to write, and the wait is counted from the refilled bucket.
    empty = rules.grant(policy, state, T0 + 0.25, 10)
    assert rules.after_claim(policy, empty, 0, T0 + 0.25, 60) == (
        state,
        pytest.approx(T0 + 0.5 / rules.PACE),
    )
    assert rules.grant(policy, state, T0 + 0.52, 10).count == 1
    assert rules.grant(policy, state, T0 + 1.04, 10).count == 2
    assert rules.grant(policy, state, T0 + 100, 10).count == 3  # never more than the burst
    # Fewer due than granted: only what was taken is spent, and no token wait is suggested.
    granted = rules.grant(policy, state, T0 + 100, 10)
    after, retry_at = rules.after_claim(policy, granted, 1, T0 + 100, 60)
    assert after.tokens == pytest.approx(2) and retry_at is None


def test_an_unpaced_lane_grants_what_is_asked() -> None:
    policy = LanePolicy("s")
    state = rules.fresh_lane(policy, T0)
    granted = rules.grant(policy, state, T0, 50)
    assert granted.count == 50
    assert rules.after_claim(policy, granted, 50, T0, 60) == (state, None)


def test_a_pause_grants_nothing_until_it_ends() -> None:
    policy = LanePolicy("s")
    state = LaneState(tokens=1, refilled_at=T0, paused_until=T0 + 40)
    granted = rules.grant(policy, state, T0 + 1, 5)
    assert granted.count == 0
    assert rules.after_claim(policy, granted, 0, T0 + 1, 60)[1] == T0 + 40
    assert rules.grant(policy, state, T0 + 40.5, 5).count == 5


def test_a_retry_after_pauses_and_is_not_a_failure() -> None:
    policy = LanePolicy("s", circuit_failures=1)
    state = rules.fresh_lane(policy, T0)
    paused = rules.after_result(state, LaneResult(policy, "neutral", T0, pause=30), T0 + 1)
    assert paused is not None
    assert (paused.paused_until, paused.failures, paused.opened_at) == (T0 + 31, 0, None)
    # A later, shorter Retry-After never shortens the pause; success does not lift it.
    again = rules.after_result(paused, LaneResult(policy, "neutral", T0, pause=5), T0 + 2)
    assert again is None
    assert rules.after_result(paused, LaneResult(policy, "success", T0), T0 + 2) is None


def test_the_circuit_opens_probes_and_closes() -> None:
    policy = LanePolicy("s", circuit_failures=2, circuit_pause=10, circuit_max=25)
    state = rules.fresh_lane(policy, T0)

    def fail(state: LaneState, started: float, now: float) -> LaneState:
        new = rules.after_result(state, LaneResult(policy, "failure", started), now)
        return state if new is None else new

    state = fail(state, T0, T0 + 1)
    assert (state.failures, state.opened_at) == (1, None)
    state = fail(state, T0, T0 + 2)
    assert (state.failures, state.opened_at, state.paused_until) == (2, T0 + 2, T0 + 12)
    # Already in flight when it opened: not counted.
    assert fail(state, T0 + 1, T0 + 3) == state
    # After the pause: one probe, holding the lane for its lease.
    granted = rules.grant(policy, state, T0 + 12.5, 8)
    assert granted.count == 1
    state, retry_at = rules.after_claim(policy, granted, 1, T0 + 12.5, 60)
    assert state.paused_until == retry_at == T0 + 72.5
    # The probe fails: twice the pause, replacing the probe's hold; then capped.
    state = fail(state, T0 + 12.5, T0 + 13)
    assert state.paused_until == T0 + 33
    state = fail(state, T0 + 13, T0 + 14)
    assert state.paused_until == T0 + 39  # 40 capped to 25
    closed = rules.after_result(state, LaneResult(policy, "success", T0 + 40), T0 + 41)
    assert closed is not None
    assert (closed.failures, closed.opened_at, closed.paused_until) == (0, None, 0.0)
    assert rules.grant(policy, closed, T0 + 41, 8).count == 8


def test_without_a_threshold_the_circuit_never_opens() -> None:
    policy = LanePolicy("s", circuit_failures=0)
    state = rules.fresh_lane(policy, T0)
    for n in range(50):
        state = rules.after_result(state, LaneResult(policy, "failure", T0), T0 + n) or state
    assert state.paused_until == 0 and state.opened_at is None


@pytest.mark.parametrize(
    "error,expected",
    [
        (None, ("success", None)),
        (TransientError("429", retry_after=7, status=429), ("neutral", 7)),
        (TransientError("503", retry_after=3, status=503), ("neutral", 3)),
        (TransientError("500", status=500), ("failure", None)),
        (TransientError("timed out"), ("failure", None)),
        (NotReady("file not ready"), ("neutral", None)),
        (UrlRefused("403", asset_ids=("a",)), ("neutral", None)),
        (PermanentError("400"), ("neutral", None)),
        (RuntimeError("bug"), ("failure", None)),
    ],
)
def test_what_an_attempt_tells_its_lane(error: BaseException | None, expected: object) -> None:
    assert lane_result(error) == expected


def test_burst() -> None:
    assert burst_for(0) == burst_for(1) == burst_for(5) == 1.0
    assert burst_for(100) == 10.0
