"""The scheduled backups: deploy/systemd/receiver-backup.service and .timer (systemd-analyze
verify and security; installed as receiver.service is; their command run for real), and
deploy/kubernetes/backup-cronjob.yaml (the inbox's volume, on the receiver pod's node, never
selected by the receiver's Services). kubernetes-validate checks the CronJob with every other
manifest in test_kubernetes.py."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from receiver.store.schema_version import SCHEMA_VERSION
from tests.deploy.support import DEPLOY, run_tool
from tests.support.helpers import ROOT
from tests.support.old_inbox import make_sqlite_inbox
from tests.support.services import require_module, require_tool

SYSTEMD = DEPLOY / "systemd"
SERVICE = SYSTEMD / "receiver-backup.service"
TIMER = SYSTEMD / "receiver-backup.timer"
INSTALLED_COMMAND = "/opt/receiver/bin/receiver"
BACKUPS = "/var/backups/receiver"
CONFIG = "/etc/receiver/config.toml"
MAX_EXPOSURE = 2.0
DOCUMENTED = f"{INSTALLED_COMMAND} backup --config {CONFIG} {BACKUPS} --keep 7"


def settings(path: Path) -> dict[str, list[str]]:
    """Every Key=Value line of a unit, values of repeated keys in order."""
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def runnable_units(tmp_path: Path) -> tuple[Path, Path]:
    """The two units, side by side, running this checkout's receiver."""
    command = require_tool("receiver", installed_by="make test")
    service = tmp_path / SERVICE.name
    service.write_text(SERVICE.read_text().replace(INSTALLED_COMMAND, command))
    timer = tmp_path / TIMER.name
    timer.write_text(TIMER.read_text())
    return service, timer


def test_systemd_analyze_verify_reports_nothing_for_both_units(tmp_path: Path) -> None:
    analyze = require_tool("systemd-analyze")
    service, timer = runnable_units(tmp_path)
    assert run_tool([analyze, "verify", str(timer), str(service)]) == ""


def test_systemd_analyze_security_rates_the_backup_service_ok(tmp_path: Path) -> None:
    analyze = require_tool("systemd-analyze")
    service, _timer = runnable_units(tmp_path)
    output = run_tool(
        [
            analyze,
            "security",
            "--offline=yes",
            f"--threshold={round(MAX_EXPOSURE * 10)}",
            "--no-pager",
            str(service),
        ]
    )
    level = re.search(
        r"Overall exposure level for receiver-backup\.service: ([\d.]+) (\w+)", output
    )
    assert level, output
    assert float(level.group(1)) <= MAX_EXPOSURE
    assert level.group(2) in {"OK", "SAFE"}


def test_installed_as_the_receiver_with_its_documented_command() -> None:
    backup, receiver = settings(SERVICE), settings(SYSTEMD / "receiver.service")
    for key in ("User", "Group", "Environment", "EnvironmentFile", "WorkingDirectory"):
        assert backup[key] == receiver[key], key
    assert backup["Type"] == ["oneshot"]
    assert backup["ExecStart"] == [DOCUMENTED]
    assert backup["ReadWritePaths"] == [f"-{BACKUPS}"]
    assert "PrivateNetwork" in backup and backup["ProtectSystem"] == ["strict"]
    assert f"install -d -o receiver -g receiver -m 0750 {BACKUPS}" in SERVICE.read_text()
    timer = settings(TIMER)
    assert timer["OnCalendar"] == ["daily"]
    assert timer["Persistent"] == ["true"]
    assert timer["WantedBy"] == ["timers.target"]
    assert "Unit" not in timer  # it starts the service of its own name
    # docs/operations.md shows the same command.
    operations = (ROOT / "docs" / "operations.md").read_text()
    assert f"backup --config {CONFIG} \\\n  {BACKUPS} --keep 7" in operations


def test_the_units_command_backs_up_and_keeps_the_newest_seven(tmp_path: Path) -> None:
    """ExecStart as written (the paths moved under tmp_path), run nine times: seven copies."""
    db = tmp_path / "state" / "data" / "receiver.db"
    db.parent.mkdir(parents=True)
    make_sqlite_inbox(db, SCHEMA_VERSION, events=5)
    config = tmp_path / "config.toml"
    config.write_text(
        '[webhook]\nsecrets = ["whsec_units"]\n[store]\nurl = "sqlite:///data/receiver.db"\n'
    )
    backups = tmp_path / "backups"
    backups.mkdir()
    argv = shlex.split(settings(SERVICE)["ExecStart"][0])
    assert argv[0] == INSTALLED_COMMAND
    argv = [sys.executable, "-m", "receiver"] + [
        {CONFIG: str(config), BACKUPS: str(backups)}.get(arg, arg) for arg in argv[1:]
    ]
    for _ in range(9):
        done = subprocess.run(
            argv, cwd=db.parent.parent, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
    copies = sorted(p.name for p in backups.iterdir())
    assert len(copies) == 7, copies
    assert all(re.fullmatch(r"receiver-\d{8}T\d{6}Z(-\d+)?\.db", name) for name in copies)


@pytest.fixture(scope="module")
def cronjob_file() -> list[dict]:
    yaml = require_module("yaml")
    return list(yaml.safe_load_all((DEPLOY / "kubernetes" / "backup-cronjob.yaml").read_text()))


def test_the_cronjob_backs_up_the_deployments_volume_on_its_node(cronjob_file: list[dict]) -> None:
    yaml = require_module("yaml")
    k8s = DEPLOY / "kubernetes"
    deployment = yaml.safe_load((k8s / "deployment.yaml").read_text())
    services = list(yaml.safe_load_all((k8s / "service.yaml").read_text()))
    by_kind = {doc["kind"]: doc for doc in cronjob_file}
    assert set(by_kind) == {"CronJob", "PersistentVolumeClaim"}
    cronjob = by_kind["CronJob"]
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    template = cronjob["spec"]["jobTemplate"]["spec"]["template"]
    pod = template["spec"]
    receiver_pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    receiver = receiver_pod["containers"][0]

    assert container["image"] == receiver["image"]
    assert container["args"] == ["backup", "--config", CONFIG, "/backups", "--keep", "7"]
    assert container["envFrom"] == receiver["envFrom"]
    assert container["securityContext"] == receiver["securityContext"]
    assert pod["securityContext"] == receiver_pod["securityContext"]

    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    receiver_volumes = {v["name"]: v for v in receiver_pod["volumes"]}
    receiver_mounts = {m["mountPath"]: m["name"] for m in receiver["volumeMounts"]}
    for path in ("/data", "/etc/receiver"):  # the inbox's volume and the config, where it has them
        assert volumes[mounts[path]] == receiver_volumes[receiver_mounts[path]], path
    backup_claim = volumes[mounts["/backups"]]["persistentVolumeClaim"]["claimName"]
    assert backup_claim == by_kind["PersistentVolumeClaim"]["metadata"]["name"]

    # On the receiver pod's node (a ReadWriteOnce volume), and never behind its Services.
    (term,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    receiver_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert term["labelSelector"]["matchLabels"].items() <= receiver_labels.items()
    labels = template["metadata"]["labels"]
    for service in services:
        assert not service["spec"]["selector"].items() <= labels.items()
