"""[tracing] as a user meets it: a bad value is one line naming its key, tracing without the
extra is one line naming ``receiver[otel]``, and with tracing off nothing of OpenTelemetry is
imported, however far a webhook goes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import ROOT

BASE = '[webhook]\nsecrets = ["whsec_test"]\n'


@pytest.mark.parametrize(
    "table,key",
    [
        ("sample_ratio = 1.5", "tracing.sample_ratio: must be between 0 and 1"),
        ('endpoint = "collector:4318"', "tracing.endpoint: must be an http:// or https://"),
        ('service_name = ""', "tracing.service_name: must not be empty"),
        ('enabled = "yes"', "tracing.enabled"),
        ("sample = 1", "tracing.sample"),
    ],
)
async def test_a_bad_tracing_value_is_one_line_naming_the_key(tmp_path, table, key):
    path = tmp_path / "config.toml"
    path.write_text(f"{BASE}[tracing]\n{table}\n")
    code, _out, err = await run_cli("check-config", "--config", str(path))
    assert code == 2
    assert_one_clean_line(err)
    assert len(err.strip().splitlines()) == 1, err
    assert key in err


async def test_tracing_without_the_extra_is_one_line_naming_it(tmp_path):
    # A regular package named opentelemetry, first on the path, hides the installed one.
    shadow = tmp_path / "shadow" / "opentelemetry"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    path = tmp_path / "config.toml"
    path.write_text(f"{BASE}[tracing]\nenabled = true\n")
    env = {"PYTHONPATH": f"{shadow.parent}{os.pathsep}{ROOT}"}
    code, _out, err = await run_cli("check-config", "--config", str(path), env=env)
    assert code == 2
    assert_one_clean_line(err)
    assert len(err.strip().splitlines()) == 1, err
    assert "tracing.enabled" in err and "receiver[otel]" in err


def test_with_tracing_off_nothing_of_opentelemetry_is_imported():
    """A receiver with tracing off handles a webhook end to end in a fresh interpreter."""
    program = """
import asyncio, json, sys, time
from aiohttp.test_utils import TestClient, TestServer
from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.signature import webhook_headers

async def main():
    settings = parse_settings(
        {"webhook": {"secrets": ["s"]}, "store": {"url": "memory://"},
         "sinks": [{"name": "f", "type": "download", "directory": "unused"}]},
        env={},
    )
    async with Runtime(settings, role="intake") as runtime:
        async with TestClient(TestServer(runtime.public_app())) as client:
            body = json.dumps({"id": "e1", "object": "event", "event": "job.completed",
                               "job_id": "j1"}).encode()
            headers = webhook_headers("s", body, int(time.time()), event_id="e1",
                                      event_name="job.completed")
            response = await client.post("/webhooks", data=body, headers=headers)
            assert response.status == 200, response.status
    traced = ("opentelemetry", "receiver.observe.tracing", "receiver.intake.tracing")
    loaded = sorted(m for m in sys.modules if m.startswith(traced))
    print(json.dumps(loaded))

asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
