"""``receiver check-config`` (and ``serve``) with sink tables, as a user runs them."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from receiver.extras import install_hint
from tests.support.helpers import ROOT, free_port, write_config

ALL_SINKS = [
    {
        "name": "stream",
        "type": "redis",
        "url": "redis://:redispass@127.0.0.1:6379/0",
        "stream": "receiver:events",
    },
    {
        "name": "bus",
        "type": "amqp",
        "url": "amqp://guest:amqppass@127.0.0.1:5672/",
        "exchange": "receiver",
        "queue": "receiver-events",
    },
    {
        "name": "js",
        "type": "nats",
        "url": "nats://127.0.0.1:4222",
        "subject": "receiver.{event}",
        "stream": "RECEIVER",
        "create_stream": True,
    },
    {
        "name": "chat",
        "type": "slack",
        "url": "https://hooks.slack.com/services/T0/B0/hooktoken",
        "events": ["job.failed"],
    },
    {
        "name": "forward",
        "type": "http",
        "url": "https://events.internal/in",
        "secret": "forwardsecret",
        "job_types": ["logo"],
    },
    {"name": "script", "type": "exec", "command": ["/usr/bin/logger", "-t", "receiver"]},
]
SECRETS = ("redispass", "amqppass", "hooktoken", "forwardsecret")


def config(tmp_path, sinks=ALL_SINKS):
    return write_config(
        tmp_path / "config.toml",
        {
            "webhook": {"secrets": ["whsec_check"]},
            "store": {"url": f"sqlite:///{tmp_path}/inbox.db"},
            "server": {"port": free_port()},
            "admin": {"port": free_port()},
            "sinks": sinks,
        },
    )


async def run(*argv, blocked=()):
    """``receiver argv...`` in a fresh interpreter where importing ``blocked`` fails, as when
    the extra providing that library is not installed."""
    code = (
        "import sys\n"
        f"for name in {list(blocked)!r}:\n"
        "    sys.modules[name] = None\n"
        "from receiver.cli import main\n"
        f"sys.exit(main({list(argv)!r}))\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ},
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


async def test_all_sinks_pass_and_no_secret_is_shown(tmp_path):
    code, out, err = await run("check-config", "--config", str(config(tmp_path)))
    assert code == 0, err
    for line in (
        "stream (redis): all events",
        "bus (amqp): all events",
        "js (nats): all events",
        "chat (slack): job.failed",
        "forward (http): all events",
        "script (exec): all events",
    ):
        assert line in out
    for secret in SECRETS:
        assert secret not in out and secret not in err


@pytest.mark.parametrize(
    "library,sink,extra",
    [("redis", "stream", "redis"), ("aio_pika", "bus", "amqp"), ("nats", "js", "nats")],
)
async def test_a_missing_extra_names_the_pip_install(tmp_path, library, sink, extra):
    path = config(tmp_path)
    code, out, err = await run("check-config", "--config", str(path), blocked=[library])
    assert code == 2
    assert out == ""
    assert err.strip().splitlines() == [
        f"receiver: config: sinks.{sink}.type: the {extra} sink needs an optional library; "
        + install_hint(extra, cwd=ROOT)
    ]


async def test_serve_refuses_to_start_without_the_extra(tmp_path):
    path = config(tmp_path, [ALL_SINKS[0]])
    code, _out, err = await run("serve", "--config", str(path), blocked=["redis"])
    assert code == 2
    assert "Traceback" not in err
    assert install_hint("redis", cwd=ROOT) in err


async def test_a_config_without_broker_sinks_needs_no_extra(tmp_path):
    path = config(tmp_path, ALL_SINKS[3:])
    code, _out, err = await run(
        "check-config", "--config", str(path), blocked=["redis", "aio_pika", "nats"]
    )
    assert code == 0, err


async def test_bad_sink_keys_are_one_line_each(tmp_path):
    path = config(
        tmp_path,
        [
            {"name": "stream", "type": "redis", "stream": "s", "maxlen": "many"},
            {"name": "chat", "type": "slack", "url": "https://h", "template": "{jobid}"},
            {"name": "forward", "type": "http", "url": "https://h", "secret": "s", "retries": 3},
        ],
    )
    code, out, err = await run("check-config", "--config", str(path))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    assert all(line.startswith("receiver: config: sinks.") for line in lines)
    assert "receiver: config: sinks.stream.maxlen: must be an integer, not str" in lines
    assert "receiver: config: sinks.stream.url: missing" in lines
    assert any(line.startswith("receiver: config: sinks.chat.template: {jobid}") for line in lines)
    assert "receiver: config: sinks.forward.retries: not a key of http sinks" in lines
