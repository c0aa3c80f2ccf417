"""Times for people: ISO UTC, "3 min ago", and what --since accepts."""

from __future__ import annotations

import pytest

from receiver.humantime import ago, iso_utc, parse_duration, parse_since

NOW = 1_795_000_000.0  # 2026-11-18T11:06:40Z


def test_iso_utc() -> None:
    assert iso_utc(0) == "1970-01-01T00:00:00Z"
    assert iso_utc(NOW + 0.9) == "2026-11-18T11:06:40Z"


@pytest.mark.parametrize(
    "delta,text",
    [
        (0.2, "just now"),
        (12, "12 s ago"),
        (50, "1 min ago"),
        (180, "3 min ago"),
        (3 * 3600 + 100, "3 h ago"),
        (3 * 86400, "3 days ago"),
        (-10, "in the future"),
    ],
)
def test_ago(delta: float, text: str) -> None:
    assert ago(NOW - delta, NOW) == text


def test_durations() -> None:
    assert parse_duration("90s") == 90
    assert parse_duration("5m") == 300
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2d") == 172800
    for bad in ("", "5", "m5", "5x", "1h 30q"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_since_takes_a_duration_or_a_utc_time() -> None:
    assert parse_since("10m", NOW) == NOW - 600
    assert parse_since("2026-11-19", NOW) == 1_795_046_400.0
    assert parse_since("2026-11-18T11:06:40Z", NOW) == NOW
    assert parse_since("2026-11-18T11:06:40", NOW) == NOW
    assert parse_since("2026-11-18T12:06:40+01:00", NOW) == NOW
    with pytest.raises(ValueError, match="give a duration"):
        parse_since("yesterday", NOW)
