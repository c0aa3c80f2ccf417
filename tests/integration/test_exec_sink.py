"""The ``exec`` sink running real processes: stdin, environment, exit codes, timeouts."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap

import pytest

from receiver.errors import PermanentError, TransientError
from receiver.sinks.exec import ExecSink
from tests.support.helpers import wait_for
from tests.support.peers import enriched_event
from tests.support.sinks import sink_settings


def exec_sink(command, **options):
    return ExecSink(sink_settings("cmd", "exec", command=command, **options))


def script(tmp_path, body: str) -> list[str]:
    path = tmp_path / "hook.py"
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waiting for its parent counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_event_on_stdin_and_in_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RECEIVER_API_KEY", "service_must_not_leak")
    monkeypatch.setenv("SOME_PARENT_VAR", "inherited")
    out = tmp_path / "seen.json"
    command = script(
        tmp_path,
        f"""
        import json, os, sys
        data = sys.stdin.buffer.read()
        json.dump({{"stdin": data.decode(), "env": dict(os.environ), "cwd": os.getcwd()}},
                  open({str(out)!r}, "w"))
        """,
    )
    workdir = tmp_path / "work"
    workdir.mkdir()
    sink = exec_sink(command, env={"EXTRA": "yes"}, cwd=str(workdir))
    event = enriched_event()
    await sink.send(event)
    seen = json.loads(out.read_text())
    assert seen["stdin"].encode() == event.to_bytes()
    env = seen["env"]
    assert env["RECEIVER_EVENT_ID"] == "evt_1"
    assert env["RECEIVER_EVENT"] == "job.completed"
    assert env["RECEIVER_JOB_ID"] == "job_1"
    assert env["RECEIVER_JOB_TYPE"] == "image_generation"
    assert env["EXTRA"] == "yes" and env["SOME_PARENT_VAR"] == "inherited"
    assert "RECEIVER_API_KEY" not in env
    assert seen["cwd"] == str(workdir)


async def test_arguments_are_never_shell_syntax(tmp_path):
    marker = tmp_path / "pwned"
    out = tmp_path / "args.json"
    command = script(
        tmp_path,
        f"""
        import json, sys
        json.dump(sys.argv[1:], open({str(out)!r}, "w"))
        """,
    )
    await exec_sink([*command, f"; touch {marker}", "$(id)"]).send(enriched_event())
    assert json.loads(out.read_text()) == [f"; touch {marker}", "$(id)"]
    assert not marker.exists()


async def test_nonzero_exit_is_a_failed_attempt_with_stderrs_tail(tmp_path):
    command = script(
        tmp_path,
        """
        import sys
        sys.stdin.read()
        sys.stderr.write("x" * 5000 + "\\nupload refused: quota exceeded\\n")
        sys.exit(3)
        """,
    )
    with pytest.raises(TransientError) as caught:
        await exec_sink(command).send(enriched_event())
    message = str(caught.value)
    assert "exited with status 3" in message
    assert message.endswith("upload refused: quota exceeded")
    assert len(message) < 2300  # the tail, not the whole stderr


async def test_a_command_that_ignores_stdin_is_fine(tmp_path):
    await exec_sink(["/bin/true"]).send(enriched_event())


async def test_timeout_kills_the_whole_process_group(tmp_path):
    pids = tmp_path / "pids"
    command = script(
        tmp_path,
        f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        sys.stderr.write("started, now stuck\\n")
        sys.stderr.flush()
        time.sleep(60)
        """,
    )
    sink = exec_sink(command, timeout_seconds=2)
    with pytest.raises(TransientError) as caught:
        await sink.send(enriched_event())
    message = str(caught.value)
    assert "timed out" in message and "process group was killed" in message
    assert "started, now stuck" in message
    for pid in map(int, pids.read_text().split()):

        async def gone(pid=pid):
            return not alive(pid)

        await wait_for(gone, 5, what=f"process {pid} to be gone")


async def test_a_cancelled_attempt_kills_the_process_group_too(tmp_path):
    pids = tmp_path / "pids"
    command = script(
        tmp_path,
        f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(60)
        """,
    )
    task = asyncio.create_task(exec_sink(command).send(enriched_event()))

    async def started():
        return pids.exists() and len(pids.read_text().split()) == 2

    await wait_for(started, 10, what="the command to start its child")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for pid in map(int, pids.read_text().split()):

        async def gone(pid=pid):
            return not alive(pid)

        await wait_for(gone, 5, what=f"process {pid} to be gone")


async def test_killed_by_a_signal(tmp_path):
    command = script(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    with pytest.raises(TransientError, match="killed by SIGSEGV"):
        await exec_sink(command).send(enriched_event())


async def test_missing_or_not_executable_command_is_dead_at_once(tmp_path):
    with pytest.raises(PermanentError, match="no such file"):
        await exec_sink([str(tmp_path / "nope")]).send(enriched_event())
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\nexit 0\n")
    with pytest.raises(PermanentError, match="permission denied"):
        await exec_sink([str(plain)]).send(enriched_event())


async def test_cloudevents_envelope_is_structured_json_on_stdin(tmp_path):
    from tests.support.outbound import assert_is_the_event, from_http

    out = tmp_path / "stdin.json"
    command = script(
        tmp_path, f"import sys; open({str(out)!r}, 'wb').write(sys.stdin.buffer.read())"
    )
    event = enriched_event()
    await exec_sink(command, envelope="cloudevents").send(event)
    cloudevent = from_http({"Content-Type": "application/cloudevents+json"}, out.read_bytes())
    assert_is_the_event(cloudevent, event)
