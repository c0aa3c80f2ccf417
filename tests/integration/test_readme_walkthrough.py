"""The README's walkthrough, run command by command as a newcomer would, in a fresh directory.

The commands come from the README's fenced blocks marked for it:

- ```` ```sh walkthrough ````: each command runs in turn and must exit 0;
- ```` ```sh walkthrough-background ````: each command starts and keeps running (a second
  terminal); the first command after such a block is retried until it succeeds (up to 30 s),
  so the README makes that command the check a person would make (``curl .../readyz``).

A command may continue over lines ending in ``\\``. The directory holds a copy of ``examples/``,
as a checkout does. The default ports (8080, 9091, 8090) are replaced by free ones, in the
commands and in the ``config.toml`` the walkthrough writes, so runs never collide.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.helpers import ROOT, free_port
from tests.support.services import require_tool

README = ROOT / "README.md"
_BLOCK = re.compile(r"^```sh (walkthrough(?:-background)?)\n(.*?)^```", re.M | re.S)
DEFAULT_PORTS = ("8080", "9091", "8090")
RETRY_SECONDS = 30.0


@dataclass(frozen=True)
class Step:
    command: str
    background: bool
    retry: bool


def walkthrough_steps(text: str) -> list[Step]:
    """The marked commands of ``text`` in order (see the module docstring)."""
    steps: list[Step] = []
    after_background = False
    for match in _BLOCK.finditer(text):
        background = match.group(1) == "walkthrough-background"
        pending = ""
        for line in match.group(2).splitlines():
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1].strip() + " "
                continue
            command = (pending + line.strip()).strip()
            pending = ""
            if not command or command.startswith("#"):
                continue
            steps.append(Step(command, background, retry=after_background and not background))
            after_background = background
    return steps


def test_the_markers_are_found() -> None:
    steps = walkthrough_steps(README.read_text())
    commands = " ; ".join(s.command for s in steps)
    for needed in ("receiver init", "receiver serve", "receiver simulate", "events list"):
        assert needed in commands
    assert any(s.background for s in steps) and any(s.retry for s in steps)
    sample = "```sh walkthrough\na \\\n  b  # c\n# only a comment\n```\n"
    sample += "```sh walkthrough-background\nserve\n```\n```sh walkthrough\ncheck\nnext\n```\n"
    assert walkthrough_steps(sample) == [
        Step("a b  # c", False, False),
        Step("serve", True, False),
        Step("check", False, True),
        Step("next", False, False),
    ]


class Walkthrough:
    """Runs the steps in ``directory`` with the ports mapped to free ones."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ports = {port: str(free_port()) for port in DEFAULT_PORTS}
        bin_dir = str(Path(sys.executable).parent)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
        self.env["PATH"] = bin_dir + os.pathsep + self.env.get("PATH", "")
        self.background: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.transcript: list[str] = []

    def localize(self, text: str) -> str:
        return re.sub(r"\b(8080|9091|8090)\b", lambda m: self.ports[m.group(1)], text)

    def _localize_config(self) -> None:
        """Map the ports in ``config.toml`` once, when a step wrote them.

        The file is replaced in one rename (keeping its private mode), never truncated and
        rewritten in place: a command started in the background may be reading it right then.
        """
        config = self.dir / "config.toml"
        if not config.exists():
            return
        text = config.read_text()
        localized = self.localize(text)
        if localized == text:
            return
        scratch = config.with_name(config.name + ".localized")
        scratch.write_text(localized)
        scratch.chmod(config.stat().st_mode & 0o777)
        os.replace(scratch, config)

    def run(self, step: Step) -> None:
        command = self.localize(step.command)
        if step.background:
            log = self.dir / f"background-{len(self.background)}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    ["bash", "-c", f"exec {command}"],
                    cwd=self.dir,
                    env=self.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.background.append((command, proc, log))
            self.transcript.append(f"$ {command} &")
            return
        deadline = time.monotonic() + (RETRY_SECONDS if step.retry else 0)
        while True:
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=self.dir,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            if done.returncode == 0 or time.monotonic() >= deadline:
                break
            self._check_background(command)
            time.sleep(0.2)
        self.transcript.append(f"$ {command}\n{done.stdout}{done.stderr}")
        assert done.returncode == 0, (
            f"`{command}` exited {done.returncode}\n{done.stdout}\n{done.stderr}\n"
            + self.background_logs()
        )
        self._localize_config()

    def _check_background(self, waiting_for: str) -> None:
        for command, proc, _log in self.background:
            if proc.poll() is not None:
                pytest.fail(
                    f"`{command}` ended ({proc.returncode}) while waiting for `{waiting_for}`\n"
                    + self.background_logs()
                )

    def background_logs(self) -> str:
        return "\n".join(
            f"--- {command}\n{log.read_text(errors='replace')[-3000:]}"
            for command, _proc, log in self.background
        )

    def stop(self) -> None:
        for _command, proc, _log in reversed(self.background):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
        for _command, proc, _log in self.background:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_the_readme_walkthrough_runs_top_to_bottom(tmp_path: Path) -> None:
    require_tool("curl", installed_by="make deploy-tools")  # the walkthrough's checks use it
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    walk = Walkthrough(tmp_path)
    started = time.monotonic()
    try:
        for step in walkthrough_steps(README.read_text()):
            walk.run(step)
    finally:
        walk.stop()
    transcript = "\n".join(walk.transcript)
    # What the walkthrough promises a newcomer, beyond every command succeeding:
    assert (tmp_path / "config.toml").stat().st_mode & 0o077 == 0, "the secret's file is private"
    assert "seed" in transcript  # the simulator says how to repeat its run
    assert list((tmp_path / "data" / "downloads").rglob("*.png")), "files were downloaded"
    tail_log = next(log for command, _p, log in walk.background if "events tail" in command)
    assert "job.completed" in tail_log.read_text()
    for _command, proc, _log in walk.background:
        assert proc.returncode in (0, 130, -signal.SIGINT), walk.background_logs()
    assert time.monotonic() - started < 90
