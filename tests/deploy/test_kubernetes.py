"""deploy/kubernetes: kubernetes-validate on the core kinds, and the manifests' cross-references.

kubernetes-validate knows the schemas of Kubernetes' own kinds only. The Prometheus Operator's
ServiceMonitor and PrometheusRule are custom resources without a schema there: their structure
is checked here, and the PrometheusRule's groups must equal deploy/prometheus/alerts.yml (which
promtool checks and a real Prometheus runs, see test_prometheus.py).
"""

import os
import subprocess
import sys
import tomllib

import pytest

from receiver.config.load import parse_settings
from tests.deploy.support import DEPLOY, run_tool
from tests.support.services import require_module, require_tool

K8S = DEPLOY / "kubernetes"
CORE_KINDS = {
    "ConfigMap",
    "Secret",
    "PersistentVolumeClaim",
    "Deployment",
    "Service",
    "Ingress",
    "CronJob",  # backup-cronjob.yaml, with a PersistentVolumeClaim of its own
}
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}
NOT_APPLIED = {"kustomization.yaml", "secret.example.yaml"}
OLDEST_KUBERNETES = "1.28.0"


@pytest.fixture(scope="module")
def yaml():
    return require_module("yaml")


@pytest.fixture(scope="module")
def manifests(yaml):
    """kind -> list of documents, over every manifest file."""
    found = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            found.setdefault(doc["kind"], []).append(doc)
    return found


def one(manifests, kind):
    assert len(manifests[kind]) == 1, kind
    return manifests[kind][0]


def service(manifests, name):
    return next(s for s in manifests["Service"] if s["metadata"]["name"] == name)


def pod_spec(manifests):
    return one(manifests, "Deployment")["spec"]["template"]["spec"]


def receiver_config(manifests):
    return tomllib.loads(one(manifests, "ConfigMap")["data"]["config.toml"])


def core_manifest_files(yaml):
    return [
        str(path)
        for path in sorted(K8S.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        and {d["kind"] for d in yaml.safe_load_all(path.read_text())} <= CORE_KINDS
    ]


@pytest.mark.parametrize("version", [None, OLDEST_KUBERNETES])
def test_kubernetes_validate_strict_passes_every_core_manifest(yaml, manifests, version):
    validate = require_tool("kubernetes-validate")
    args = [validate, "--strict", *core_manifest_files(yaml)]
    if version:
        args[1:1] = ["-k", version]
    output = run_tool(args)
    assert "ERROR" not in output and "WARN" not in output, output
    documents = sum(len(manifests[kind]) for kind in CORE_KINDS)
    assert output.count(" passed for resource ") == documents == 9


def test_every_kind_is_known(manifests):
    assert set(manifests) == CORE_KINDS | CUSTOM_KINDS


def test_kustomization_applies_every_manifest_but_the_secret_example(yaml):
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    expected = sorted(p.name for p in K8S.glob("*.yaml") if p.name not in NOT_APPLIED)
    assert sorted(kustomization["resources"]) == expected


def test_one_replica_recreated_never_two_pods_on_the_sqlite_volume(manifests):
    deployment = one(manifests, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert receiver_config(manifests)["store"]["url"].startswith("sqlite:////data/")
    (pvc,) = [
        p for p in manifests["PersistentVolumeClaim"] if p["metadata"]["name"] == "receiver-data"
    ]
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    volumes = {v["name"]: v for v in pod_spec(manifests)["volumes"]}
    mounts = {
        m["mountPath"]: m["name"] for m in pod_spec(manifests)["containers"][0]["volumeMounts"]
    }
    assert volumes[mounts["/data"]]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]


def test_probes_ports_and_grace_period_match_the_receiver_config(manifests):
    spec = pod_spec(manifests)
    container = spec["containers"][0]
    config = receiver_config(manifests)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": config["server"]["port"], "ops": config["admin"]["port"]}
    assert config["admin"]["host"] == "0.0.0.0"  # the kubelet probes the pod IP
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "ops"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "ops"}
    assert container["resources"]["requests"] and container["resources"]["limits"]
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain = config["server"]["shutdown_timeout_seconds"]
    assert spec["terminationGracePeriodSeconds"] > pause + drain + 5
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_configmap_config_is_valid_with_the_secret_example(manifests, tmp_path):
    secret = one(manifests, "Secret")
    container = pod_spec(manifests)["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": secret["metadata"]["name"]}}]
    env = {**os.environ, **secret["stringData"]}
    config = tmp_path / "config.toml"
    config.write_text(one(manifests, "ConfigMap")["data"]["config.toml"])
    done = subprocess.run(
        [sys.executable, "-m", "receiver", "check-config", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    settings = parse_settings(tomllib.loads(config.read_text()), env=secret["stringData"])
    assert settings.webhook.secrets == ("whsec_replace_me",)


def test_services_select_the_pod_and_the_ingress_routes_only_the_webhook_path(manifests):
    pod_labels = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    container_ports = {p["name"] for p in pod_spec(manifests)["containers"][0]["ports"]}
    for svc in manifests["Service"]:
        assert svc["spec"]["selector"].items() <= pod_labels.items()
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= container_ports
    assert {p["targetPort"] for p in service(manifests, "receiver")["spec"]["ports"]} == {"http"}
    ingress = one(manifests, "Ingress")
    paths = [p for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]]
    server_path = receiver_config(manifests)["server"]["path"]
    assert [(p["path"], p["pathType"]) for p in paths] == [(server_path, "Exact")]
    backend = paths[0]["backend"]["service"]
    public_ports = {p["name"] for p in service(manifests, backend["name"])["spec"]["ports"]}
    assert backend["port"]["name"] in public_ports
    assert ingress["spec"]["tls"]


def test_the_service_monitor_scrapes_the_ops_port_as_job_receiver(manifests):
    monitor = one(manifests, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selected = [
        svc
        for svc in manifests["Service"]
        if monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    ]
    assert [svc["metadata"]["name"] for svc in selected] == ["receiver-ops"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in selected[0]["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    # Prometheus names the job after this label's value; the alerts select job="receiver".
    assert selected[0]["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "receiver"


def test_the_prometheus_rule_equals_the_alert_file_and_passes_promtool(manifests, yaml, tmp_path):
    rule = one(manifests, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    assert rule["spec"] == alerts
    for group in rule["spec"]["groups"]:
        assert group["name"]
        for r in group["rules"]:
            assert set(r) <= {"alert", "record", "expr", "for", "labels", "annotations"}
            assert r["expr"] and (r.get("alert") or r.get("record"))
    promtool = require_tool("promtool")
    extracted = tmp_path / "prometheusrule-spec.yml"
    extracted.write_text(yaml.safe_dump(rule["spec"]))
    output = run_tool([promtool, "check", "rules", str(extracted)])
    assert f"SUCCESS: {sum(len(g['rules']) for g in alerts['groups'])} rules found" in output
