"""What the Grafana dashboard and the alert rules cover, and the dashboard's own consistency.

Whether each expression runs is checked against a real Prometheus in test_prometheus.py; no
Grafana runs here, so the dashboard's structure is checked as JSON.
"""

import json
import re

from tests.deploy.promql import metric_names
from tests.deploy.support import DEPLOY
from tests.support.services import require_module

DASHBOARD = json.loads((DEPLOY / "grafana" / "receiver-dashboard.json").read_text())
ALERTS_YML = DEPLOY / "prometheus" / "alerts.yml"


def panels():
    return [p for p in DASHBOARD["panels"] if p["type"] != "row"]


def expressions():
    return [t["expr"] for p in panels() for t in p["targets"]]


def test_panels_have_unique_ids_fit_the_grid_and_use_the_datasource_variable():
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels():
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert panel["description"], panel["title"]


def test_every_variable_used_is_defined():
    defined = {v["name"] for v in DASHBOARD["templating"]["list"]} | {"__rate_interval"}
    used = set(re.findall(r"\$\{?(\w+)", json.dumps(DASHBOARD["panels"])))
    assert used <= defined
    assert {"datasource", "job", "instance"} <= used


def test_the_dashboard_shows_what_operators_watch():
    used = set().union(*(metric_names(e) for e in expressions()))
    text = "\n".join(expressions())
    for metric in (
        "receiver_webhook_requests_total",  # intake by outcome
        "receiver_signature_skew_seconds_bucket",  # clock skew
        "receiver_webhook_secret_matches_total",  # secret rotation
        "receiver_inbox_events",  # backlog
        "receiver_inbox_oldest_pending_seconds",
        "receiver_event_lag_seconds_bucket",
        "receiver_events_total",
        "receiver_sink_deliveries_total",  # success / failure / dead per sink
        "receiver_sink_delivery_seconds_bucket",
        "receiver_upstream_requests_total",  # upstream status codes
        "receiver_upstream_request_seconds_bucket",  # upstream latency
        "receiver_upstream_webhook_active",
        "receiver_upstream_webhook_consecutive_failures",
        "receiver_sink_backlog",  # each lane: waiting, oldest due, sending
        "receiver_sink_oldest_due_seconds",
        "receiver_sink_in_flight",
        "receiver_watched_jobs",  # pull mode
        "receiver_pull_events_total",
        "receiver_inbox_file_bytes",  # what the inbox takes, and on Postgres its indexes
        "receiver_inbox_index_bytes",  # beside the server's cache
        "receiver_inbox_cache_bytes",
    ):
        assert metric in used, metric
    assert 'outcome=~"missing_signature|invalid_signature|stale_timestamp"' in text
    assert "sum by (sink, outcome)" in text


def test_a_row_per_lane_repeats_by_sink():
    rows = [p for p in DASHBOARD["panels"] if p["type"] == "row" and p.get("repeat") == "sink"]
    assert len(rows) == 1 and "$sink" in rows[0]["title"]
    variable = next(v for v in DASHBOARD["templating"]["list"] if v["name"] == "sink")
    assert variable["multi"] and variable["includeAll"]
    # The row's panels: those after it, up to the next row; each one shows the chosen lane.
    start = DASHBOARD["panels"].index(rows[0]) + 1
    lane = []
    for panel in DASHBOARD["panels"][start:]:
        if panel["type"] == "row":
            break
        lane.append(panel)
    exprs = [t["expr"] for p in lane for t in p["targets"]]
    assert all('sink=~"$sink"' in e for e in exprs)
    used = set().union(*(metric_names(e) for e in exprs))
    assert used == {
        "receiver_sink_backlog",
        "receiver_sink_oldest_due_seconds",
        "receiver_sink_in_flight",
        "receiver_sink_deliveries_total",
    }


def test_the_alerts_cover_the_failure_modes():
    yaml = require_module("yaml")
    groups = yaml.safe_load(ALERTS_YML.read_text())["groups"]
    rules = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    expected = {
        "ReceiverDown": "up{",
        "ReceiverSignatureFailuresSpiking": "invalid_signature",
        "ReceiverDeadDeliveries": 'outcome="dead"',
        "ReceiverBacklogGrowing": 'state="pending"',
        "ReceiverOldestPendingTooOld": "receiver_inbox_oldest_pending_seconds",
        "ReceiverUpstreamAuthFailing": '"401|403"',
        "ReceiverUpstreamWebhookInactive": "receiver_upstream_webhook_active",
        "ReceiverLaneBehind": "receiver_sink_oldest_due_seconds",
        "ReceiverLanePausedTooLong": "receiver_sink_paused_seconds",
        "ReceiverInboxOutgrowsDatabaseCache": "receiver_inbox_cache_bytes",
    }
    for name, needle in expected.items():
        assert needle in rules[name]["expr"], name
    # A lane an operator paused on purpose is not "behind".
    assert "unless on (job, instance, sink)" in rules["ReceiverLaneBehind"]["expr"]
    assert "receiver_sink_paused{" in rules["ReceiverLaneBehind"]["expr"]
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


def test_the_latency_panels_show_exemplars_that_link_to_traces():
    for title in ("Sink delivery time (p95)", "Event lag (receipt to last delivery)"):
        (panel,) = [p for p in panels() if p["title"] == title]
        assert all(target.get("exemplar") is True for target in panel["targets"]), title
        assert "exemplar" in panel["description"]
