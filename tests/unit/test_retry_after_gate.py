"""The client-wide wait after a 429 with Retry-After (receiver.upstream.retry_after_gate)."""

from __future__ import annotations

import pytest

from receiver.errors import TransientError
from receiver.retry import MAX_RETRY_AFTER_SECONDS
from receiver.upstream.retry_after_gate import SLEEP_OUT_SECONDS, RetryAfterGate


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_open_until_a_retry_after_then_closed_until_it_has_passed() -> None:
    clock = Clock()
    gate = RetryAfterGate(clock)
    await gate.pass_through("job j")  # open: returns at once
    gate.close_for(30)
    gate.close_for(5)  # a shorter wait never shortens a longer one
    assert gate.remaining() == 30
    with pytest.raises(TransientError) as caught:
        await gate.pass_through("job j")
    assert (caught.value.status, caught.value.retry_after) == (429, 30)
    assert "job j" in str(caught.value) and "30.0 s more" in str(caught.value)
    clock.now += 30
    assert gate.remaining() == 0
    await gate.pass_through("job j")


async def test_the_last_second_is_slept_out() -> None:
    gate = RetryAfterGate()
    gate.close_for(SLEEP_OUT_SECONDS / 4)
    await gate.pass_through("asset a")  # sleeps, then goes
    assert gate.remaining() == 0


def test_at_most_a_day_is_honoured() -> None:
    clock = Clock()
    gate = RetryAfterGate(clock)
    gate.close_for(10 * MAX_RETRY_AFTER_SECONDS)
    assert gate.remaining() == MAX_RETRY_AFTER_SECONDS
