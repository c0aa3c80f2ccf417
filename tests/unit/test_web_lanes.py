"""The overview's figures: lane rows from store counts and metrics, rates, gauge counts."""

from __future__ import annotations

from receiver.config.settings import SinkSettings
from receiver.observe.metrics import Metrics
from receiver.store.browse import InboxOverview, LaneCounts
from receiver.web.lanes import DeliveryRates, gauge_counts, lane_rows

NOW = 1_700_000_000.0


def test_rows_follow_the_config_then_sinks_only_the_store_knows():
    metrics = Metrics()
    overview = InboxOverview(
        lanes=(
            LaneCounts("gone", backlog=2, due=2, oldest_due_at=NOW - 90),
            LaneCounts("slack", backlog=3, due=0, oldest_due_at=NOW + 30, failing=1),
            LaneCounts("files", backlog=1, due=1, oldest_due_at=NOW - 5, in_flight=1),
        ),
        recent_errors=(),
    )
    sinks = [SinkSettings(name="files", type="download"), SinkSettings(name="slack", type="slack")]
    sinks.append(SinkSettings(name="idle", type="http"))
    rows = lane_rows(overview, sinks=sinks, states={}, rates=DeliveryRates(metrics), now=NOW)
    assert [(r.sink, r.type) for r in rows] == [
        ("files", "download"),
        ("slack", "slack"),
        ("idle", "http"),
        ("gone", "not configured"),
    ]
    files, slack, idle, gone = rows
    assert (files.waiting, files.next_due_at, files.in_flight, files.stuck) == (5, None, 1, False)
    assert (slack.waiting, slack.next_due_at, slack.failing) == (None, NOW + 30, 1)
    assert (idle.backlog, idle.waiting, idle.next_due_at) == (0, None, None)
    assert gone.stuck  # due for 90 s


def test_rates_are_successes_a_minute_over_the_samples_window():
    metrics = Metrics()
    rates = DeliveryRates(metrics, window=60)
    assert rates.sample(["files"], NOW) == {"files": None}
    metrics.sink_deliveries.labels("files", "success").inc(10)
    metrics.sink_deliveries.labels("files", "retry").inc(50)  # not a delivery
    assert rates.sample(["files"], NOW + 30) == {"files": 20.0}
    assert rates.sample(["files"], NOW + 90) == {"files": 0.0}  # the window moved on


def test_gauge_counts_only_once_refreshed():
    metrics = Metrics()
    assert gauge_counts(metrics, NOW) is None
    for state, value in {"pending": 2, "done": 7, "dead": 1}.items():
        metrics.inbox_events.labels(state).set(value)
    metrics.inbox_oldest_pending_seconds.set(12)
    assert gauge_counts(metrics, NOW) == ({"pending": 2, "done": 7, "dead": 1}, NOW - 12)
