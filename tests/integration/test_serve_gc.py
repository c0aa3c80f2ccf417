"""``receiver serve`` leaves what it made at start out of later garbage collections.

A full collection stops the event loop while it walks every object the collector tracks; frozen
at start, the objects that live as long as the process are never walked again. Checked in a real
``receiver serve`` process: once it has served a webhook and been stopped with SIGTERM, the
objects left for a full collection to walk are a small part of the frozen ones.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import aiohttp

from tests.support.helpers import ReceiverProcess
from tests.support.hostile import SECRET, intake_config
from tests.support.pipeline import signed

# Loaded by the serving process at its start (a sitecustomize module on its PYTHONPATH): the
# collector's state written to $GC_REPORT as the process exits.
REPORT_AT_EXIT = """
import atexit, gc, json, os

def report():
    gc.collect()
    with open(os.environ["GC_REPORT"], "w") as out:
        json.dump({"frozen": gc.get_freeze_count(), "walked": len(gc.get_objects())}, out)

atexit.register(report)
"""


async def test_a_serving_process_freezes_what_it_made_at_start(tmp_path: Path) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(REPORT_AT_EXIT)
    report = tmp_path / "gc.json"
    path = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    proc = ReceiverProcess(intake_config(tmp_path))
    proc.start(env={"PYTHONPATH": path, "GC_REPORT": str(report)})
    try:
        await proc.wait_ready()
        payload = {"id": "evt-gc-1", "object": "event", "event": "job.completed", "job_id": "j"}
        body, headers = signed(payload, SECRET)
        url = f"http://127.0.0.1:{proc.public_port}/webhooks"
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=body, headers=headers) as response,
        ):
            assert response.status == 200
        assert proc.terminate() == 0, proc.log()
    finally:
        proc.stop()
    state = json.loads(report.read_text())
    assert state["frozen"] > 20_000  # the modules, the apps, the settings: all of the start
    assert state["walked"] < state["frozen"] / 4  # what a full collection still walks
