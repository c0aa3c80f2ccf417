"""Reading the upstream's Deprecation, Sunset and Link headers, and telling a refused API
version from any other 400."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from receiver.errors import TransientError, VersionRefused
from receiver.observe.metrics import Metrics
from receiver.retry import RetryPolicy
from receiver.upstream.deprecation import (
    DeprecationWatch,
    Unreadable,
    parse_deprecation,
    parse_http_date,
    parse_links,
)
from receiver.upstream.pin import VersionPin, names_the_version

SUNSET = "Sun, 01 Nov 2026 00:00:00 GMT"
SUNSET_AT = 1793491200.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("@1688169599", (True, 1688169599.0)),  # RFC 9745
        (" @0 ", (True, 0.0)),
        ("true", (True, None)),  # the drafts before it
        ("TRUE", (True, None)),
        ("Sun, 11 Nov 2018 23:59:59 GMT", (True, 1541980799.0)),  # an early draft's HTTP date
    ],
)
def test_deprecation_values(value, expected):
    assert parse_deprecation(value) == expected


@pytest.mark.parametrize("value", ["", "soon", "@", "@12.5", "1688169599", "?1", "false"])
def test_unreadable_deprecation_values(value):
    with pytest.raises(Unreadable):
        parse_deprecation(value)


def test_sunset_is_an_http_date():
    assert parse_http_date(SUNSET) == SUNSET_AT
    for bad in ("", "tomorrow", "2026-11-01"):
        with pytest.raises(Unreadable):
            parse_http_date(bad)


def test_links_by_rel():
    values = [
        '<https://a.example/dep?x=1,2>; rel="deprecation"; type="text/html", '
        "<https://a.example/other>; rel=next",
        '<https://a.example/sun>; title="x"; rel="alternate sunset"',
    ]
    assert parse_links(values) == {
        "deprecation": "https://a.example/dep?x=1,2",
        "sunset": "https://a.example/sun",
    }
    assert parse_links(["<https://a.example/>; rel=deprecation"]) == {
        "deprecation": "https://a.example/"
    }
    assert parse_links(["not a link", ""]) == {}


def sample(metrics: Metrics, name: str, endpoint: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"endpoint": endpoint})


def test_the_watch_counts_every_answer_and_logs_each_announcement_once():
    metrics = Metrics()
    watch = DeprecationWatch(metrics)
    with capture_logs() as logs:
        for _ in range(3):
            watch.observe("/jobs/{id}", 200, "@1700000000", SUNSET, [])
        watch.observe("/assets/{id}", 200, None, None, [])
        later = "Mon, 01 Feb 2027 00:00:00 GMT"
        watch.observe("/jobs/{id}", 200, "@1700000000", later, [])  # a new date: logged again
        watch.observe("/jobs/{id}", 404, None, None, [])  # an error answer withdraws nothing

    assert sample(metrics, "receiver_upstream_deprecated_total", "/jobs/{id}") == 4
    assert sample(metrics, "receiver_upstream_deprecated_total", "/assets/{id}") is None
    assert sample(metrics, "receiver_upstream_sunset_timestamp_seconds", "/jobs/{id}") == (
        parse_http_date(later)
    )
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [(e["endpoint"], e["sunset_at"]) for e in warnings] == [
        ("/jobs/{id}", "2026-11-01T00:00:00+00:00"),
        ("/jobs/{id}", "2027-02-01T00:00:00+00:00"),
    ]

    watch.observe("/jobs/{id}", 200, None, None, [])  # the upstream no longer announces it
    assert sample(metrics, "receiver_upstream_sunset_timestamp_seconds", "/jobs/{id}") is None
    assert watch.notices == {}


def test_a_deprecation_without_sunset_is_withdrawn_and_a_moving_date_is_not_logged_forever():
    metrics = Metrics()
    watch = DeprecationWatch(metrics)
    with capture_logs() as logs:
        watch.observe("/assets/{id}", 200, "true", None, [])
        watch.observe("/assets/{id}", 200, None, None, [])  # withdrawn: nothing to drop
        for day in range(1, 31):  # a Sunset that moves on every answer
            watch.observe("/jobs/{id}", 200, None, f"Sun, {day:02d} Nov 2026 00:00:00 GMT", [])
    assert watch.notices["/jobs/{id}"].sunset_at == parse_http_date("Mon, 30 Nov 2026 00:00:00 GMT")
    assert sample(metrics, "receiver_upstream_deprecated_total", "/jobs/{id}") == 30
    warned = [e["endpoint"] for e in logs if e["log_level"] == "warning"]
    assert warned == ["/assets/{id}"] + ["/jobs/{id}"] * 8


def test_a_sunset_alone_counts_and_an_unreadable_one_does_not():
    metrics = Metrics()
    watch = DeprecationWatch(metrics)
    with capture_logs() as logs:
        watch.observe("/webhooks", 200, None, SUNSET, [])
        watch.observe("/webhooks/{id}", 204, "someday", "never", [])
    assert sample(metrics, "receiver_upstream_deprecated_total", "/webhooks") == 1
    assert sample(metrics, "receiver_upstream_sunset_timestamp_seconds", "/webhooks") == SUNSET_AT
    assert sample(metrics, "receiver_upstream_deprecated_total", "/webhooks/{id}") is None
    assert [(e["log_level"], e["event"]) for e in logs] == [
        ("warning", "the upstream announces a sunset date for an endpoint the receiver uses"),
        ("debug", "unreadable Deprecation header ignored"),
        ("debug", "unreadable Sunset header ignored"),
    ]


@pytest.mark.parametrize(
    ("code", "message", "param", "expected"),
    [
        ("validation_failed", "Invalid.", "Service-API-Version", True),
        ("unsupported_api_version", "Nope.", None, True),
        ("validation_failed", "Unknown Service-API-Version header.", None, True),
        ("validation_failed", "2026-08-20 is not supported.", None, True),
        ("validation_failed", "Unsupported API version.", None, True),
        ("validation_failed", "timeout must be a number.", "timeout", False),
        ("invalid_idempotency_key", "Idempotency-Key must be 1 to 255 characters.", None, False),
        (None, None, None, False),
    ],
)
def test_which_400s_name_the_version(code, message, param, expected):
    assert names_the_version("2026-08-20", code, message, param) is expected


def test_the_pin_logs_once_and_clears_on_success():
    metrics = Metrics()
    pin = VersionPin("2026-08-20", metrics)
    gauge = "receiver_upstream_version_refused"
    assert metrics.registry.get_sample_value(gauge) == 0
    with capture_logs() as logs:
        for _ in range(3):
            error = pin.refusal("/jobs/{id}", "upstream answered 400", "bad_version", "x", None)
            assert isinstance(error, VersionRefused)
        assert pin.refusal("/jobs/{id}", "upstream answered 400", "other", "x", "y") is None
    assert [e["log_level"] for e in logs] == ["error"]
    assert metrics.registry.get_sample_value(gauge) == 1
    assert pin.problems() and "2026-08-20" in pin.problems()[0]
    pin.accepted()
    assert pin.problems() == [] and metrics.registry.get_sample_value(gauge) == 0


def test_a_refused_version_is_never_dead_however_many_attempts():
    policy = RetryPolicy(initial=1.0, maximum=600.0, max_attempts=3)
    refused = VersionRefused("the upstream refused the pinned API version")
    assert not policy.decide(refused, 3).dead
    for attempts in (12, 5000):  # waits as long as the cap at most, and no overflow
        decision = policy.decide(refused, attempts)
        assert not decision.dead and 300.0 <= decision.delay <= 600.0
    assert policy.decide(TransientError("503"), 3).dead
