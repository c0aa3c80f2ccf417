"""The PromQL reading the dashboard and alert checks rely on."""

from tests.deploy.promql import exposed_names, matchers, metric_names


def test_metric_names_leave_out_functions_keywords_labels_and_durations():
    expr = (
        "histogram_quantile(0.95, sum by (le, sink) (rate(receiver_sink_delivery_seconds_bucket"
        '{job="receiver", instance=~"a|b"}[5m]))) > 1e3 and on (job) up{job="x"} == 0'
        " or absent(receiver_inbox_events offset 5m) unless vector(1)"
    )
    assert metric_names(expr) == {
        "receiver_sink_delivery_seconds_bucket",
        "up",
        "receiver_inbox_events",
    }


def test_matchers_name_their_metric():
    expr = 'sum(rate(receiver_webhook_requests_total{job="r", outcome=~"accepted|duplicate"}[1m]))'
    assert list(matchers(expr)) == [
        ("receiver_webhook_requests_total", "job", "=", "r"),
        ("receiver_webhook_requests_total", "outcome", "=~", "accepted|duplicate"),
    ]


def test_exposed_names_include_families_without_samples():
    page = (
        "# HELP a_total help\n# TYPE a_total counter\na_total 1.0\n"
        "# HELP g help\n# TYPE g gauge\n"
        "# HELP h help\n# TYPE h histogram\n"
    )
    assert exposed_names(page) >= {"a_total", "g", "h_bucket", "h_sum", "h_count"}
    assert "g_total" not in exposed_names(page)
