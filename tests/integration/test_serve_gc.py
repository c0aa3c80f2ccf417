"""``receiver serve`` leaves what it made at start out of later garbage collections.

A full collection stops the event loop while it walks every object the collector tracks; frozen
at start, the objects that live as long as the process are never walked again. Checked in a real
``receiver serve`` process: once it has served a webhook and been stopped with SIGTERM, the
objects left for a full collection to walk are a small part of the frozen ones.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import aiohttp

from tests.support.helpers import wait_for
from tests.support.hostile import SECRET, intake_config
from tests.support.pipeline import signed

# receiver serve, as the console script runs it, reporting the collector's state when it returns.
SERVE = """
import atexit, gc, json, sys
from receiver.cli import main

def report():
    gc.collect()
    with open(sys.argv[1], "w") as out:
        json.dump({"frozen": gc.get_freeze_count(), "walked": len(gc.get_objects())}, out)

atexit.register(report)
sys.exit(main(sys.argv[2:]))
"""


async def test_a_serving_process_freezes_what_it_made_at_start(tmp_path: Path) -> None:
    config = intake_config(tmp_path)
    settings = tomllib.loads(config.read_text())
    public, ops = settings["server"]["port"], settings["admin"]["port"]
    report = tmp_path / "gc.json"
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(report), "serve", "--config", str(config)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=log,
        stderr=log,
    )
    log.close()
    try:
        async with aiohttp.ClientSession() as session:

            async def ready() -> bool:
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                try:
                    async with session.get(f"http://127.0.0.1:{ops}/readyz") as response:
                        return response.status == 200
                except aiohttp.ClientError:
                    return False

            await wait_for(ready, timeout=20, what="receiver serve ready")
            payload = {"id": "evt-gc-1", "object": "event", "event": "job.completed", "job_id": "j"}
            body, headers = signed(payload, SECRET)
            url = f"http://127.0.0.1:{public}/webhooks"
            async with session.post(url, data=body, headers=headers) as response:
                assert response.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, (tmp_path / "serve.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    state = json.loads(report.read_text())
    assert state["frozen"] > 20_000  # the modules, the apps, the settings: all of the start
    assert state["walked"] < state["frozen"] / 4  # what a full collection still walks
