"""Shared by the deploy tests: paths, running a tool, a background server, log lines."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.helpers import ROOT, stop_process

DEPLOY = ROOT / "deploy"


def run_tool(args: Sequence[str], *, cwd: Path | None = None, timeout: float = 60) -> str:
    """Run a command; its combined output, or an AssertionError showing it on a non-zero exit."""
    done = subprocess.run(
        list(args),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{output}"
    return output


class Background:
    """A server process (caddy, prometheus) with its output in a log file."""

    def __init__(
        self, args: Sequence[str], *, log_path: Path, cwd: Path, env: dict[str, str] | None = None
    ) -> None:
        self.args = list(args)
        self.log_path = log_path
        self.cwd = cwd
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Background:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def check_running(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.args[0]} exited {self.proc.returncode}:\n{self.log()}")

    def stop(self) -> None:
        stop_process(self.proc)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects among the lines of a log."""
    lines = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            lines.append(value)
    return lines
