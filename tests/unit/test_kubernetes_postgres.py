"""deploy/kubernetes-postgres stays consistent with the receiver it deploys."""

import re
import textwrap
import tomllib

from receiver.config.load import parse_settings
from tests.support.helpers import ROOT

HERE = ROOT / "deploy" / "kubernetes-postgres"
SECRET_ENV = {
    "RECEIVER_STORE_URL": "postgresql://receiver:pw@postgres.db.svc:5432/receiver",
    "RECEIVER_WEBHOOK_SECRETS": "whsec_x",
    "RECEIVER_API_KEY": "service_x",
    "RECEIVER_ADMIN_TOKEN": "token",
}


def shipped_config():
    text = (HERE / "configmap.yaml").read_text()
    block = text.split("config.toml: |\n", 1)[1]
    return tomllib.loads(textwrap.dedent(block))


def test_the_configmap_is_a_valid_postgres_config_once_the_secret_is_in_the_environment():
    settings = parse_settings(shipped_config(), env=SECRET_ENV)
    assert settings.store.url == SECRET_ENV["RECEIVER_STORE_URL"]
    assert settings.store.schema == "receiver"
    assert settings.admin.host == "0.0.0.0"  # probes and Prometheus use the pod IP
    deployment = (HERE / "deployment.yaml").read_text()
    grace = int(re.search(r"terminationGracePeriodSeconds: (\d+)", deployment).group(1))
    assert settings.server.shutdown_timeout_seconds < grace
    assert int(re.search(r"replicas: (\d+)", deployment).group(1)) >= 2


def test_every_secret_key_the_pods_read_is_in_the_example_secret():
    example = (HERE / "secret.example.yaml").read_text()
    keys = set(re.findall(r"^  ([a-z-]+): ", example.split("stringData:", 1)[1], re.M))
    for name in ("deployment.yaml", "migrate-job.yaml"):
        used = set(
            re.findall(
                r"secretKeyRef: \{name: receiver, key: ([a-z-]+)\}", (HERE / name).read_text()
            )
        )
        assert used and used <= keys, name
    assert "store-url" in keys


def test_kustomization_lists_files_that_exist():
    text = (HERE / "kustomization.yaml").read_text()
    resources = re.findall(r"^  - (\S+\.yaml)$", text, re.M)
    assert resources and all((HERE / r).is_file() for r in resources)
