"""How often the inbox gauges are refreshed: every 5 s, less often only while counting is slow."""

from __future__ import annotations

from receiver.app import GAUGE_REFRESH_SECONDS, gauge_refresh_interval


def test_a_fast_count_refreshes_every_five_seconds() -> None:
    assert gauge_refresh_interval(0.01, 0.0) == GAUGE_REFRESH_SECONDS
    assert gauge_refresh_interval(0.01, 0.02) == GAUGE_REFRESH_SECONDS


def test_one_slow_count_alone_does_not_stretch_the_interval() -> None:
    # The first refresh of a starting receiver (nothing before it), or a busy moment.
    assert gauge_refresh_interval(0.6, 0.0) == GAUGE_REFRESH_SECONDS
    assert gauge_refresh_interval(0.6, 0.01) == GAUGE_REFRESH_SECONDS


def test_counts_slow_twice_in_a_row_keep_counting_at_two_percent_of_the_time() -> None:
    # A large inbox: each count takes 2 s, so the next one comes 98 s later.
    assert gauge_refresh_interval(2.0, 2.0) == 98.0
    assert gauge_refresh_interval(2.0, 1.0) == 49.0  # by the faster of the two
