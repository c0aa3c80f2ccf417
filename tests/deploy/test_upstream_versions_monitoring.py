"""What the dashboard, the alert rules and docs/operations.md show of the upstream's versions:
drift, retirement notices, invalid objects, a refused api.version.

When each alert fires is tested by promtool (tests/deploy/rules/upstream_versions_test.yml and
upstream_sunset_test.yml);
that each expression runs on a real receiver's metrics, by test_prometheus.py.
"""

import json

from tests.deploy.promql import metric_names
from tests.deploy.support import DEPLOY
from tests.support.helpers import ROOT
from tests.support.services import require_module

DASHBOARD = json.loads((DEPLOY / "grafana" / "receiver-dashboard.json").read_text())
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()
METRICS = (
    "receiver_upstream_spec_info",
    "receiver_upstream_drift",
    "receiver_upstream_invalid_total",
    "receiver_upstream_deprecated_total",
    "receiver_upstream_sunset_timestamp_seconds",
    "receiver_upstream_version_refused",
)
ALERTS = {
    "ReceiverUpstreamBreakingDrift": ("receiver_upstream_drift{", 'severity="breaking"', "> 0"),
    "ReceiverUpstreamSunsetSoon": ("receiver_upstream_sunset_timestamp_seconds{", "time()"),
    "ReceiverUpstreamInvalidObjects": ("rate(receiver_upstream_invalid_total{", "> 0"),
    "ReceiverUpstreamVersionRefused": ("receiver_upstream_version_refused{", "== 1"),
}


def version_row() -> list[dict]:
    """The panels of the dashboard's upstream versions row."""
    panels = DASHBOARD["panels"]
    (row,) = [p for p in panels if p["type"] == "row" and "versions" in p["title"].lower()]
    found = []
    for panel in panels[panels.index(row) + 1 :]:
        if panel["type"] == "row":
            break
        found.append(panel)
    return found


def test_the_dashboard_row_shows_every_upstream_version_metric():
    row = version_row()
    exprs = [t["expr"] for p in row for t in p["targets"]]
    used = set().union(*(metric_names(e) for e in exprs))
    assert used == set(METRICS)
    by_title = {p["title"]: [t["expr"] for t in p["targets"]] for p in row}
    assert any("sum by (endpoint)" in e for e in by_title["Deprecated answers by endpoint"])
    assert any("sum by (object, field)" in e for e in by_title["Invalid upstream objects by field"])
    assert any("by (severity)" in e for e in by_title["Drift by severity"])
    assert any("revision" in e for e in by_title["Upstream spec revision"])
    assert all('instance=~"$instance"' in e for e in exprs)


def test_the_alerts_ship_in_both_rule_files():
    yaml = require_module("yaml")
    groups = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"]
    rules = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    for name, needles in ALERTS.items():
        for needle in needles:
            assert needle in rules[name]["expr"], (name, needle)
    assert rules["ReceiverUpstreamBreakingDrift"]["for"] == "10m"
    assert rules["ReceiverUpstreamInvalidObjects"]["for"] == "15m"
    assert "30 * 86400" in rules["ReceiverUpstreamSunsetSoon"]["expr"]
    assert rules["ReceiverUpstreamVersionRefused"]["labels"]["severity"] == "critical"


def test_operations_lists_the_metrics_and_alerts():
    for metric in METRICS:
        assert f"`{metric}" in OPERATIONS, metric
    for alert in ALERTS:
        assert f"| `{alert}`" in OPERATIONS, alert
