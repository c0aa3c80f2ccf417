"""deploy/compose: `docker-compose config` resolves it, and its pieces point at each other.

No Docker engine runs here: the stack is not started. Its parts are run for real elsewhere
(Caddy in test_caddy.py, Prometheus with the dashboard and alerts in test_prometheus.py, the
image's healthcheck in test_docker.py); this checks the wiring between them.
"""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.deploy.support import DEPLOY, run_tool
from tests.support.services import require_module, require_tool

COMPOSE = DEPLOY / "compose"
ENV_EXAMPLE = COMPOSE / ".env.example"


def compose_command(env_file):
    return [
        require_tool("docker-compose"),
        "--env-file",
        str(env_file),
        "--project-directory",
        str(COMPOSE),
        "-f",
        str(COMPOSE / "compose.yaml"),
        "config",
    ]


@pytest.fixture(scope="module")
def resolved():
    """The compose file as docker-compose resolves it with .env.example."""
    yaml = require_module("yaml")
    return yaml.safe_load(run_tool(compose_command(ENV_EXAMPLE)))


def receiver_config():
    return tomllib.loads((COMPOSE / "config.toml").read_text())


def bind_mounts(service):
    """(host path, container path) for each bind mount, as docker-compose resolved them."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("/"):
            mounts.append((Path(source), target))
    return mounts


def test_required_settings_are_named_when_missing(tmp_path):
    empty = tmp_path / "empty.env"
    empty.write_text("")
    done = subprocess.run(compose_command(empty), capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "set RECEIVER_" in done.stderr


def test_every_bind_mount_exists(resolved):
    for name, service in resolved["services"].items():
        for source, _target in bind_mounts(service):
            assert source.exists(), f"{name}: {source}"


def test_only_caddy_is_published_and_the_ops_port_never_is(resolved):
    services = resolved["services"]
    assert "ports" not in services["receiver"]
    assert {p["target"] for p in services["caddy"]["ports"]} == {80, 443}
    for name in ("prometheus", "grafana"):
        assert all(p.startswith("127.0.0.1:") for p in services[name]["ports"]), name
    published = [p for s in services.values() for p in s.get("ports", [])]
    assert str(receiver_config()["admin"]["port"]) not in str(published)


def test_caddy_proxies_to_the_receiver_and_is_its_trusted_proxy(resolved):
    caddy = resolved["services"]["caddy"]
    config = receiver_config()
    assert caddy["environment"]["RECEIVER_UPSTREAM"] == f"receiver:{config['server']['port']}"
    assert (DEPLOY / "caddy" / "Caddyfile", "/etc/caddy/Caddyfile") in bind_mounts(caddy)
    address = caddy["networks"]["edge"]["ipv4_address"]
    assert config["server"]["trusted_proxies"] == [address]
    assert caddy["depends_on"]["receiver"]["condition"] == "service_healthy"


def test_the_receiver_service_runs_the_image_with_this_config(resolved):
    receiver = resolved["services"]["receiver"]
    assert Path(receiver["build"]["context"], receiver["build"]["dockerfile"]) == (
        DEPLOY / "docker" / "Dockerfile"
    )
    mounts = dict((target, source) for source, target in bind_mounts(receiver))
    assert mounts[receiver["environment"]["RECEIVER_CONFIG"]] == COMPOSE / "config.toml"
    grace = receiver["stop_grace_period"]
    assert grace.endswith("s")
    assert float(grace[:-1]) > receiver_config()["server"]["shutdown_timeout_seconds"]


def test_the_compose_config_is_valid_with_the_example_secrets():
    env = {**os.environ}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "receiver",
            "check-config",
            "--config",
            str(COMPOSE / "config.toml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_prometheus_scrapes_the_ops_listener_with_the_alert_rules(resolved):
    yaml = require_module("yaml")
    prometheus = resolved["services"]["prometheus"]
    mounts = dict((target, source) for source, target in bind_mounts(prometheus))
    config_path = mounts["/etc/prometheus/prometheus.yml"]
    config = yaml.safe_load(config_path.read_text())
    for rule_file in config["rule_files"]:
        assert mounts[f"/etc/prometheus/{rule_file}"].exists()
    (job,) = config["scrape_configs"]
    (static,) = job["static_configs"]
    assert static["targets"] == [f"receiver:{receiver_config()['admin']['port']}"]
    receiver_networks = set(resolved["services"]["receiver"]["networks"])
    assert set(prometheus["networks"]) & receiver_networks


def test_jaeger_is_optional_and_the_receiver_exports_to_it(resolved):
    services = resolved["services"]
    jaeger = services["jaeger"]
    assert jaeger["profiles"] == ["tracing"]
    assert all(p.startswith("127.0.0.1:") for p in jaeger["ports"])
    assert jaeger["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    environment = services["receiver"]["environment"]
    assert environment["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]
    assert "tracing" in receiver_config()  # turned on there, off by default
    assert receiver_config()["tracing"]["enabled"] is False


def test_grafana_is_provisioned_with_the_data_source_and_the_dashboard(resolved):
    yaml = require_module("yaml")
    grafana = resolved["services"]["grafana"]
    mounts = dict((target, source) for source, target in bind_mounts(grafana))
    provisioning = "/etc/grafana/provisioning"
    sources = yaml.safe_load(
        (mounts[f"{provisioning}/datasources"] / "prometheus.yml").read_text()
    )["datasources"]
    assert [(s["type"], s["url"]) for s in sources] == [
        ("prometheus", "http://prometheus:9090"),
        ("jaeger", "http://jaeger:16686"),  # the optional tracing profile's traces
    ]
    # Exemplars' trace ids open their trace in the Jaeger data source.
    (link,) = sources[0]["jsonData"]["exemplarTraceIdDestinations"]
    assert (link["name"], link["datasourceUid"]) == ("trace_id", sources[1]["uid"])
    (provider,) = yaml.safe_load(
        (mounts[f"{provisioning}/dashboards"] / "receiver.yml").read_text()
    )["providers"]
    folder = provider["options"]["path"]
    dashboards = [source for target, source in mounts.items() if target.startswith(folder + "/")]
    assert dashboards == [DEPLOY / "grafana" / "receiver-dashboard.json"]
