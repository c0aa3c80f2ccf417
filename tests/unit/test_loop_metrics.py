"""The loop's counters and histogram scrape exactly as prometheus_client's own families did."""

from __future__ import annotations

import re

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    enable_created_metrics,
    generate_latest,
)
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from receiver.observe.loop_metrics import LoopCounter, LoopHistogram
from receiver.observe.metrics import _SKEW_BUCKETS, WEBHOOK_OUTCOMES, Metrics

SKEWS = (-400.0, -300.0, -299.9, -0.5, 0.0, 0.0, 0.2, 1.0, 4.9, 59.0, 299.0, 300.0, 301.0, 1e9)


def scrape(registry: CollectorRegistry, *, openmetrics: bool = False) -> str:
    """The exposition with every ``_created`` value blanked (each family's own clock)."""
    text = (openmetrics_latest if openmetrics else generate_latest)(registry).decode()
    return re.sub(r"(_created(?:\{[^}]*\})?) \S+", r"\1 T", text)


def counted(counter_class, histogram_class, registry):
    requests = counter_class(
        "receiver_webhook_requests", "Requests by outcome.", ["outcome"], registry=registry
    )
    for outcome in WEBHOOK_OUTCOMES:
        requests.labels(outcome)
    events = counter_class(
        "receiver_events", "Events by name and outcome.", ["event", "outcome"], registry=registry
    )
    plain = counter_class("receiver_plain", "No labels.", registry=registry)
    skew = histogram_class(
        "receiver_signature_skew_seconds", "Skew.", buckets=_SKEW_BUCKETS, registry=registry
    )
    latency = histogram_class(
        "receiver_latency_seconds", "Positive buckets.", buckets=(0.1, 1, 10), registry=registry
    )
    for _ in range(3):
        requests.labels("accepted").inc()
    requests.labels("duplicate").inc(2)
    events.labels("job.completed", "received").inc()
    events.labels("job.failed", "duplicate").inc()
    events.labels("job.completed", "received").inc()
    (plain.labels() if counter_class is LoopCounter else plain).inc()
    for amount in SKEWS:
        skew.observe(amount)
        latency.observe(abs(amount) / 100)
    return requests, events


def test_the_scrape_is_the_one_prometheus_client_gave() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    counted(Counter, Histogram, theirs)
    counted(LoopCounter, LoopHistogram, ours)
    expected = scrape(theirs)
    assert "receiver_signature_skew_seconds_count 14.0" in expected  # the families really ran
    assert scrape(ours) == expected
    # and in OpenMetrics, which /metrics answers when the scraper asks for it
    assert scrape(ours, openmetrics=True) == scrape(theirs, openmetrics=True)


def test_created_series_follow_prometheus_clients_switch() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    counted(Counter, Histogram, theirs)
    counted(LoopCounter, LoopHistogram, ours)
    disable_created_metrics()
    try:
        expected = scrape(theirs)
        assert "_created" not in expected
        assert scrape(ours) == expected
    finally:
        enable_created_metrics()


def test_values_read_back_like_the_clients() -> None:
    registry = CollectorRegistry()
    requests, events = counted(LoopCounter, LoopHistogram, registry)
    assert requests.labels("accepted").get() == 3.0
    assert events.labels("job.completed", "received").get() == 2.0
    failed = {"event": "job.failed", "outcome": "duplicate"}
    assert registry.get_sample_value("receiver_events_total", failed) == 1.0
    assert registry.get_sample_value("receiver_signature_skew_seconds_bucket", {"le": "0.0"}) == 6.0


def test_a_series_refuses_what_a_counter_refuses() -> None:
    registry = CollectorRegistry()
    counter = LoopCounter("receiver_x", "X.", ["a", "b"], registry=registry)
    with pytest.raises(ValueError):
        counter.labels("only one")
    with pytest.raises(ValueError):
        counter.labels("1", "2").inc(-1)
    with pytest.raises(ValueError):  # the registry refuses a second family of the same name
        LoopCounter("receiver_x", "X again.", registry=registry)


def test_metrics_families_are_the_ones_scraped_before() -> None:
    """Every family of Metrics with its type and label names, as the dashboards use them."""
    text = generate_latest(Metrics().registry).decode()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert types["receiver_webhook_requests_total"] == "counter"
    assert types["receiver_webhook_secret_matches_total"] == "counter"
    assert types["receiver_events_total"] == "counter"
    assert types["receiver_pull_events_total"] == "counter"
    assert types["receiver_signature_skew_seconds"] == "histogram"
    for outcome in WEBHOOK_OUTCOMES:
        assert f'receiver_webhook_requests_total{{outcome="{outcome}"}} 0.0' in text
    for source in ("webhook", "poll", "reconcile"):
        assert f'receiver_pull_events_total{{source="{source}"}} 0.0' in text
    assert 'receiver_signature_skew_seconds_bucket{le="+Inf"} 0.0' in text
    assert "receiver_signature_skew_seconds_count 0.0" in text
    assert "receiver_signature_skew_seconds_sum" not in text  # negative buckets: no _sum
