"""That earlier version's ``receiver`` as ``make_inboxes.py`` runs it: ``serve`` as its own
process, configured in that version's format, and its commands beside it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def toml(data: dict[str, Any]) -> str:
    """Sections of scalars and lists, and ``sinks`` as ``[[sinks]]`` tables."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)

    lines = []
    for section, table in data.items():
        tables = table if section == "sinks" else [table]
        for t in tables:
            lines.append(f"[[{section}]]" if section == "sinks" else f"[{section}]")
            lines.extend(f"{k} = {value(v)}" for k, v in t.items())
    return "\n".join(lines) + "\n"


async def until(
    check: Callable[[], Awaitable[bool]],
    what: str,
    timeout: float = 90.0,
    explain: Callable[[], Awaitable[str]] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            why = await explain() if explain is not None else ""
            raise SystemExit(f"timed out after {timeout} s waiting for {what}\n{why}")
        await asyncio.sleep(0.1)


class OldReceiver:
    """That version's ``receiver`` console script: ``serve`` as a process, and its commands."""

    def __init__(self, bin_dir: Path, run: Path) -> None:
        self.program = str(bin_dir / "receiver")
        self.run = run
        self.config = run / "config.toml"
        self.log = run / "receiver.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ops_port = 0

    def configure(self, config: dict[str, Any]) -> None:
        self.config.write_text(toml(config))
        self.ops_port = config["admin"]["port"]
        self.command("check-config")

    def command(self, *args: str) -> str:
        done = subprocess.run(
            [self.program, *args, "--config", str(self.config)],
            cwd=self.run,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(
                f"receiver {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done.stdout

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [self.program, "serve", "--config", str(self.config)],
                cwd=self.run,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

        async def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise SystemExit(f"receiver serve exited {self.proc.returncode}:\n{self.tail()}")
            try:
                async with aiohttp.ClientSession() as s, s.get(self.ops("/readyz")) as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await until(ready, "receiver serve to be ready", 60)

    def ops(self, path: str) -> str:
        return f"http://127.0.0.1:{self.ops_port}{path}"

    def stop(self) -> int:
        """SIGTERM, and the exit code (a receiver still running after 60 s is killed)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise SystemExit(f"receiver serve ignored SIGTERM for 60 s:\n{self.tail()}") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])
