"""``receiver healthcheck``: the ops listener the config names, one line, exit 0 or 1."""

import asyncio
import subprocess
import sys

import pytest
from aiohttp import web

from receiver.cli.healthcheck import ops_url
from receiver.config.settings import AdminSettings
from tests.support.helpers import ReceiverProcess, free_port, write_config

SECRET = "whsec_healthcheck_cli"


def healthcheck(config, *args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "receiver", "healthcheck", "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=30,
    )


def config_with_ops_port(tmp_path, port, host="127.0.0.1"):
    return write_config(
        tmp_path / "config.toml",
        {
            "server": {"host": "127.0.0.1", "port": free_port()},
            "admin": {"host": host, "port": port},
            "webhook": {"secrets": [SECRET]},
            "store": {"url": f"sqlite:///{tmp_path}/receiver.db"},
        },
    )


async def test_ready_on_a_non_default_admin_port_then_no_answer_once_stopped(tmp_path):
    port = free_port()
    assert port != 9091
    proc = ReceiverProcess(config_with_ops_port(tmp_path, port, host="0.0.0.0"))
    proc.start()
    try:
        await proc.wait_ready()
        ready = healthcheck(proc.config)
        live = healthcheck(proc.config, "--live")
        assert proc.terminate() == 0
    finally:
        proc.stop()
    assert (ready.returncode, ready.stderr) == (0, "")
    assert ready.stdout == f"http://127.0.0.1:{port}/readyz: 200 ready\n"
    assert live.stdout == f"http://127.0.0.1:{port}/healthz: 200 ok\n"
    stopped = healthcheck(proc.config)
    assert (stopped.returncode, stopped.stdout) == (1, "")
    assert stopped.stderr == (f"http://127.0.0.1:{port}/readyz: no answer (Connection refused)\n")


@pytest.fixture
async def not_ready_ops_listener(aiohttp_server):
    """An ops listener answering /readyz as a receiver does while its store is down."""

    async def readyz(_request):
        reasons = ["store: database unreachable", "workers: not running"]
        return web.json_response({"status": "unavailable", "reasons": reasons}, status=503)

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    return await aiohttp_server(app)


async def test_not_ready_is_exit_1_with_the_reasons(tmp_path, not_ready_ops_listener):
    config = config_with_ops_port(tmp_path, not_ready_ops_listener.port)
    # The listener runs on this test's loop: the command runs without blocking it.
    done = await asyncio.to_thread(healthcheck, config)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"http://127.0.0.1:{not_ready_ops_listener.port}/readyz: 503 "
        "store: database unreachable; workers: not running\n"
    )


def test_a_bad_config_is_one_line_and_exit_2(tmp_path):
    missing = healthcheck(tmp_path / "nowhere.toml")
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1 and "nowhere.toml" in missing.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('[admin]\nport = "ninety"\n')
    done = healthcheck(bad, env={"RECEIVER_WEBHOOK_SECRETS": SECRET, "PATH": "/usr/bin"})
    assert done.returncode == 2
    assert "admin.port" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("0.0.0.0", "http://127.0.0.1:9191/readyz"),
        ("::", "http://[::1]:9191/readyz"),
        ("10.0.0.7", "http://10.0.0.7:9191/readyz"),
        ("fd00::7", "http://[fd00::7]:9191/readyz"),
        ("ops.internal", "http://ops.internal:9191/readyz"),
    ],
)
def test_the_url_reaches_the_listener_from_the_same_host(host, url):
    assert ops_url(AdminSettings(host=host, port=9191), "/readyz") == url
