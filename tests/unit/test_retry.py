import random

import pytest

from receiver.errors import NotReady, PermanentError, TransientError
from receiver.retry import MAX_RETRY_AFTER_SECONDS, RetryPolicy, parse_retry_after


def policy(**kw):
    values = {"initial": 1.0, "maximum": 600.0, "max_attempts": 12, "rng": random.Random(7)}
    values.update(kw)
    return RetryPolicy(**values)


def test_backoff_doubles_with_jitter_and_is_capped():
    p = policy()
    for attempts in range(1, 15):
        base = min(600.0, 2 ** (attempts - 1))
        for _ in range(20):
            delay = p.backoff(attempts)
            assert base / 2 <= delay <= base


def test_permanent_errors_are_dead_at_once():
    decision = policy().decide(PermanentError("job x not found upstream"), 1)
    assert decision.dead
    assert "not found" in decision.reason


def test_transient_errors_retry_until_max_attempts():
    p = policy(max_attempts=3)
    assert not p.decide(TransientError("502"), 1).dead
    assert not p.decide(NotReady("asset webm is processing"), 2).dead
    last = p.decide(TransientError("502"), 3)
    assert last.dead
    assert last.reason == "gave up after 3 attempts: 502"


def test_longer_retry_after_wins_shorter_does_not():
    p = policy()
    assert p.decide(TransientError("429", retry_after=120), 1).delay == 120
    assert p.decide(TransientError("429", retry_after=0.1), 5).delay >= 8
    huge = p.decide(TransientError("429", retry_after=10**9), 1)
    assert huge.delay == MAX_RETRY_AFTER_SECONDS


def test_unknown_exceptions_are_transient():
    assert not policy().decide(RuntimeError("boom"), 1).dead


# ------------------------------------------------------------------ Retry-After parsing


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("soon", None),
        ("-5", None),
        ("120", 120.0),
        (" 3 ", 3.0),
        ("1.5", 1.5),
        ("Thu, 01 Jan 1970 00:01:40 GMT", 0.0),
        ("Thu, 01 Jan 1970 00:03:20 GMT", 100.0),
        ("Thursday, 01-Jan-70 00:03:20 GMT", 100.0),  # RFC 850, obsolete but allowed
        ("Thu, 99 Foo 1970 00:03:20 GMT", None),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, now=lambda: 100.0) == expected
