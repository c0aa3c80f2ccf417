"""Prometheus scraping a real receiver; every dashboard and alert expression runs against it.

One receiver (fed by the simulator and ``receiver replay``) and one Prometheus are shared by the
module. The alert rules are loaded by that Prometheus from deploy/prometheus/alerts.yml, so
their expressions are taken from its rules API, exactly as it parsed them.
"""

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from receiver.observe.metrics import SINK_OUTCOMES, WEBHOOK_OUTCOMES
from receiver.store.records import EVENT_STATES
from tests.deploy.promql import exposed_names, matchers, metric_names
from tests.deploy.support import DEPLOY, Background, run_tool
from tests.support.helpers import ROOT, free_port, write_config
from tests.support.services import require_tool

PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"
ALERTS_YML = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "receiver-dashboard.json"
RULE_TESTS = ROOT / "tests" / "deploy" / "rules"
SECRET = "whsec_scraped"
JOB = "receiver"
# What the dashboard's template variables stand for in these queries.
DASHBOARD_VARIABLES = {"$__rate_interval": "1m", "$job": JOB, "$instance": ".*", "$sink": ".*"}
# Label values an expression may select, where the receiver defines them.
KNOWN_VALUES = {
    ("receiver_webhook_requests_total", "outcome"): set(WEBHOOK_OUTCOMES),
    ("receiver_sink_deliveries_total", "outcome"): set(SINK_OUTCOMES),
    ("receiver_inbox_events", "state"): set(EVENT_STATES),
}


def http_get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read()


def wait_until(predicate, what, timeout=30.0, processes=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in processes:
            process.check_running()
        try:
            if predicate():
                return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_promtool_checks_the_shipped_config_and_rules():
    promtool = require_tool("promtool")
    config = run_tool([promtool, "check", "config", str(PROMETHEUS_YML)])
    assert "SUCCESS: 1 rule files found" in config
    assert f"SUCCESS: {PROMETHEUS_YML} is valid prometheus config file syntax" in config
    rules = run_tool([promtool, "check", "rules", str(ALERTS_YML)])
    count = len(re.findall(r"^\s*- (?:alert|record):", ALERTS_YML.read_text(), re.MULTILINE))
    assert f"SUCCESS: {count} rules found" in rules


def test_promtool_unit_tests_of_the_alert_rules():
    """tests/deploy/rules/*_test.yml: when the alerts fire (``promtool test rules`` on
    synthetic series): the lanes, with the default and a per-sink limit, the upstream's
    versions and sunsets, the inbox outgrowing the database's cache."""
    promtool = require_tool("promtool")
    tests = sorted(RULE_TESTS.glob("*_test.yml"))
    assert tests
    # promtool evaluates every rule at each step of the synthetic series: about 2 s of CPU here
    # (the files of days-long series evaluate hourly); the limit only guards against a hang.
    output = run_tool([promtool, "test", "rules", *map(str, tests)], cwd=RULE_TESTS, timeout=300)
    assert output.count("SUCCESS") == len(tests), output


# Series that exist only once something has happened (a label value seen for the first time).
LAZY_SERIES = (
    "receiver_webhook_secret_matches_total",
    "receiver_events_total",
    "receiver_sink_deliveries_total",
    "receiver_upstream_requests_total",
)


def fresh_events(folder):
    """The example payloads under new event ids (same jobs), so each round is processed anew."""
    folder.mkdir()
    for example in sorted((ROOT / "examples").glob("*.json")):
        payload = json.loads(example.read_text())
        payload["id"] = f"{payload['id']}-{folder.name}"
        (folder / example.name).write_text(json.dumps(payload))
    return folder


class Stack:
    def __init__(self, receiver_ops, prometheus):
        self.receiver_ops = receiver_ops
        self.prometheus = prometheus

    def query(self, expr):
        url = f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            _, body = http_get(url)
        except urllib.error.HTTPError as exc:
            body = exc.read()
        return json.loads(body)

    def api(self, path):
        return json.loads(http_get(self.prometheus + path)[1])["data"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    prometheus = require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("prometheus-stack")
    python = sys.executable
    sim_port, public_port, ops_port, prom_port = (free_port() for _ in range(4))
    processes = []
    try:
        simulator = Background(
            [
                python,
                "-m",
                "receiver",
                "simulate",
                "--port",
                str(sim_port),
                "--examples",
                str(ROOT / "examples"),
            ],
            log_path=tmp / "simulator.log",
            cwd=tmp,
        ).start()
        processes.append(simulator)
        config = write_config(
            tmp / "config.toml",
            {
                "server": {"host": "127.0.0.1", "port": public_port},
                "admin": {"port": ops_port},
                "webhook": {"secrets": [SECRET]},
                "api": {"base_url": f"http://127.0.0.1:{sim_port}/v1"},
                "store": {"url": "sqlite:///inbox.db"},
                "worker": {"poll_interval_seconds": 0.1, "backoff_initial_seconds": 0.1},
                "log": {"format": "json"},
                "sinks": [
                    {
                        "name": "files",
                        "type": "download",
                        "directory": "downloads",
                        "allow_private_networks": True,
                    }
                ],
            },
        )
        receiver = Background(
            [python, "-m", "receiver", "serve", "--config", str(config)],
            log_path=tmp / "receiver.log",
            cwd=tmp,
        ).start()
        processes.append(receiver)
        ops = f"http://127.0.0.1:{ops_port}"
        wait_until(lambda: http_get(f"{ops}/readyz")[0] == 200, "the receiver", processes=processes)

        # The shipped prometheus.yml, pointed at this receiver and scraping every second.
        rendered = PROMETHEUS_YML.read_text()
        for old, new in (
            ('"receiver:9091"', f'"127.0.0.1:{ops_port}"'),
            ("scrape_interval: 15s", "scrape_interval: 1s"),
            ("evaluation_interval: 15s", "evaluation_interval: 1s"),
        ):
            assert old in rendered
            rendered = rendered.replace(old, new)
        (tmp / "prometheus.yml").write_text(rendered)
        shutil.copy(ALERTS_YML, tmp / "alerts.yml")
        server = Background(
            [
                prometheus,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--log.level=warn",
            ],
            log_path=tmp / "prometheus.log",
            cwd=tmp,
        ).start()
        processes.append(server)
        stack = Stack(ops, f"http://127.0.0.1:{prom_port}")

        def target_up():
            targets = stack.api("/api/v1/targets")["activeTargets"]
            return [t["health"] for t in targets if t["labels"]["job"] == JOB] == ["up"]

        wait_until(target_up, "the receiver target up", processes=processes)

        # Traffic while Prometheus watches. Labelled series appear with their first event, and a
        # rate needs them to move after that: a first round creates them, a second moves them.
        url = f"http://127.0.0.1:{public_port}/webhooks"
        replay = [python, "-m", "receiver", "replay", "--url", url, "--secret"]
        run_tool([*replay, SECRET, str(fresh_events(tmp / "round-1"))])

        def seen(metric):
            return lambda: stack.query(metric)["data"]["result"] != []

        for metric in LAZY_SERIES:
            wait_until(seen(metric), f"{metric} in Prometheus", processes=processes)
        run_tool([*replay, SECRET, str(fresh_events(tmp / "round-2"))])
        refused = subprocess.run(
            [*replay, "whsec_wrong", str(ROOT / "examples" / "logo-completed.json")],
            capture_output=True,
            check=False,
        )
        assert refused.returncode != 0
        yield stack
    finally:
        for process in reversed(processes):
            process.stop()


def test_the_receiver_target_is_up(stack):
    result = stack.query(f'up{{job="{JOB}"}}')
    assert result["status"] == "success"
    assert [sample["value"][1] for sample in result["data"]["result"]] == ["1"]


def test_every_alert_rule_is_loaded_and_evaluates_without_error(stack):
    expected = re.findall(r"^\s*- (?:alert|record): ([\w:]+)", ALERTS_YML.read_text(), re.MULTILINE)

    def all_evaluated():
        rules = [r for g in stack.api("/api/v1/rules")["groups"] for r in g["rules"]]
        return rules and all(not r["lastEvaluation"].startswith("0001") for r in rules)

    wait_until(all_evaluated, "every rule evaluated")
    # Prometheus lists the groups by name, not in the file's order.
    rules = sorted(
        (r for g in stack.api("/api/v1/rules")["groups"] for r in g["rules"]),
        key=lambda r: r["name"],
    )
    assert [(r["name"], r["health"], r.get("lastError", "")) for r in rules] == [
        (name, "ok", "") for name in sorted(expected)
    ]


def dashboard_expressions():
    """(where, expression) for every query in the dashboard, variables substituted."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        # Grafana's label_values(selector, label) lists the label's values on that selector.
        call = re.fullmatch(r"label_values\((.+), *(\w+)\)", variable["query"]["query"])
        assert call, f"variable {variable['name']}: unexpected query"
        found.append((f"variable {variable['name']!r}", call.group(1)))
    substituted = []
    for where, expr in found:
        for name, value in DASHBOARD_VARIABLES.items():
            expr = expr.replace(name, value)
        assert "$" not in expr, f"{where}: unknown variable in {expr}"
        substituted.append((where, expr))
    return substituted


def alert_expressions(stack):
    rules = [r for g in stack.api("/api/v1/rules")["groups"] for r in g["rules"]]
    return [(f"alert {r['name']}", r["query"]) for r in rules]


def recorded_names(stack):
    """The series the rules record themselves (a lane's alert limit): not the receiver's."""
    groups = stack.api("/api/v1/rules")["groups"]
    return {r["name"] for g in groups for r in g["rules"] if r["type"] == "recording"}


def problems_with(stack, exposed, where, expr):
    problems = []
    result = stack.query(expr)
    if result.get("status") != "success" or result.get("warnings"):
        problems.append(f"{where}: {result.get('error')} {result.get('warnings', '')} in {expr}")
    for name in sorted(metric_names(expr) - exposed - {"up"}):
        problems.append(f"{where}: the receiver exports no metric {name}")
    for metric, label, _op, value in matchers(expr):
        if label == "job" and value != JOB:
            problems.append(f"{where}: job={value!r}, the scrape job is {JOB!r}")
        known = KNOWN_VALUES.get((metric, label))
        if known is not None:
            unknown = set(value.split("|")) - known
            if unknown:
                problems.append(f"{where}: {metric} has no {label} {sorted(unknown)}")
    return problems


def test_every_dashboard_and_alert_expression_runs_on_real_metrics(stack):
    _, page = http_get(f"{stack.receiver_ops}/metrics")
    exposed = exposed_names(page.decode()) | recorded_names(stack)
    expressions = dashboard_expressions() + alert_expressions(stack)
    assert len(expressions) >= 40
    problems = [
        p for where, expr in expressions for p in problems_with(stack, exposed, where, expr)
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "panel",
    [
        "Webhooks by outcome",
        "Verified by secret",
        "Inbox by state",
        "Events by outcome",
        "Deliveries by sink and outcome",
        "Deliveries by outcome",  # the lane row's
        "Upstream requests by status",
        "Upstream latency",
        "Event lag (receipt to last delivery)",
    ],
)
def test_dashboard_panels_show_the_traffic(stack, panel):
    expressions = [
        e for where, e in dashboard_expressions() if where.startswith(f"panel {panel!r}")
    ]
    assert expressions

    def shows_data():
        return all(
            any(s["value"][1] not in ("NaN", "0") for s in stack.query(e)["data"]["result"])
            for e in expressions
        )

    wait_until(shows_data, f"data in the panel {panel!r}")
