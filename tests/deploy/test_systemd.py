"""deploy/systemd/receiver.service: systemd-analyze verify and security, and its reload for real."""

import json
import re
import shlex
import subprocess
import time

import aiohttp

from receiver.config.settings import ServerSettings
from receiver.signature import webhook_headers
from tests.deploy.support import DEPLOY, run_tool
from tests.support.helpers import ReceiverProcess, free_port, wait_for, write_config
from tests.support.services import require_tool

UNIT = DEPLOY / "systemd" / "receiver.service"
INSTALLED_COMMAND = "/opt/receiver/bin/receiver"
MAX_EXPOSURE = 2.0  # as printed: 0 (locked down) to 10 (exposed); --threshold counts tenths


def unit_settings():
    """Every Key=Value line of the unit, values of repeated keys in order."""
    settings = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def runnable_copy(tmp_path):
    """The unit running this checkout's receiver (verify checks that commands exist)."""
    text = UNIT.read_text()
    assert INSTALLED_COMMAND in text
    command = require_tool("receiver", installed_by="make test")
    copy = tmp_path / UNIT.name
    copy.write_text(text.replace(INSTALLED_COMMAND, command))
    return copy


def test_systemd_analyze_verify_reports_nothing(tmp_path):
    analyze = require_tool("systemd-analyze")
    # verify exits 0 even on an unparseable value; it only says so: its output must be empty.
    assert run_tool([analyze, "verify", str(runnable_copy(tmp_path))]) == ""


def test_systemd_analyze_security_rates_the_unit_ok(tmp_path):
    analyze = require_tool("systemd-analyze")
    output = run_tool(
        [
            analyze,
            "security",
            "--offline=yes",
            f"--threshold={round(MAX_EXPOSURE * 10)}",
            "--no-pager",
            str(runnable_copy(tmp_path)),
        ]
    )
    level = re.search(r"Overall exposure level for receiver\.service: ([\d.]+) (\w+)", output)
    assert level, output
    assert float(level.group(1)) <= MAX_EXPOSURE
    assert level.group(2) == "OK"


def test_hardened_with_a_restart_policy_and_a_stop_timeout_beyond_the_drain():
    settings = unit_settings()
    for key, value in (
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("StateDirectory", "receiver"),
        ("Restart", "on-failure"),
        ("KillSignal", "SIGTERM"),
    ):
        assert settings.get(key) == [value], key
    assert settings["User"] not in (["root"], ["0"])
    assert settings["ExecStart"] == [f"{INSTALLED_COMMAND} serve"]
    assert settings["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    drain = ServerSettings().shutdown_timeout_seconds
    assert float(settings["TimeoutStopSec"][0]) > drain * 2


def signed(secret, event_id):
    body = json.dumps(
        {"id": event_id, "object": "event", "event": "job.failed", "job_id": "job-1"}
    ).encode()
    return body, webhook_headers(
        secret, body, int(time.time()), event_id=event_id, event_name="job.failed"
    )


async def test_the_reload_command_rotates_the_webhook_secret(tmp_path):
    secrets_file = tmp_path / "webhook-secrets"
    secrets_file.write_text("whsec_old\n")
    config = write_config(
        tmp_path / "config.toml",
        {
            "server": {"host": "127.0.0.1", "port": free_port()},
            "admin": {"port": free_port()},
            "webhook": {"secrets_file": str(secrets_file)},
            "store": {"url": "sqlite:///inbox.db"},
            "log": {"format": "json"},
            "sinks": [{"name": "files", "type": "download", "directory": "downloads"}],
        },
    )
    proc = ReceiverProcess(config, role="intake")
    proc.start()
    try:
        await proc.wait_ready()
        url = f"http://127.0.0.1:{proc.public_port}/webhooks"

        async def post(secret, event_id):
            body, headers = signed(secret, event_id)
            async with aiohttp.ClientSession() as s, s.post(url, data=body, headers=headers) as r:
                return r.status

        assert await post("whsec_new", "evt-before") == 401
        secrets_file.write_text("whsec_new\n")
        assert proc.proc is not None
        reload = unit_settings()["ExecReload"][0].replace("$MAINPID", str(proc.proc.pid))
        subprocess.run(shlex.split(reload), check=True)

        async def rotated():
            return '"webhook secrets reloaded"' in proc.log()

        await wait_for(rotated, what="the secrets reloaded")
        assert await post("whsec_new", "evt-after") == 200
        assert await post("whsec_old", "evt-old") == 401
        assert proc.terminate() == 0
    finally:
        proc.stop()
