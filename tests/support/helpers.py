"""Helpers shared by the integration tests: free ports, waiting, a receiver subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from receiver.config.render import toml_value
from receiver.signature import webhook_headers

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def adjacent_free_ports() -> int:
    """A free port p with p + 1 free too (e.g. the ops listeners of ``--processes 2``)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two adjacent free ports")


async def wait_for(
    predicate: Callable[[], Awaitable[bool]],
    timeout: float = 15.0,
    interval: float = 0.05,
    what: str = "condition",
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def write_config(path: Path, data: dict[str, Any]) -> Path:
    """Write a dict of sections (and a ``sinks`` list) as TOML."""
    lines: list[str] = []
    for section, table in data.items():
        if section == "sinks":
            continue
        lines.append(f"[{section}]")
        lines.extend(f"{k} = {toml_value(v)}" for k, v in table.items())
    for sink in data.get("sinks", []):
        lines.append("[[sinks]]")
        lines.extend(f"{k} = {toml_value(v)}" for k, v in sink.items())
    path.write_text("\n".join(lines) + "\n")
    tomllib.loads(path.read_text())
    return path


class ReceiverProcess:
    """``receiver serve`` in a subprocess, for crash and shutdown tests."""

    def __init__(
        self,
        config: Path,
        *,
        role: str = "all",
        cwd: Path | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.config = config
        self.role = role
        self.args = args
        self.cwd = cwd or config.parent
        data = tomllib.loads(config.read_text())
        self.ops_port = data["admin"]["port"]
        self.public_port = data.get("server", {}).get("port", 8080)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.cwd / f"receiver-{self.ops_port}.log"

    def start(self, env: dict[str, str] | None = None) -> None:
        """Start the process; ``env`` adds variables for this start only (e.g. a fault point)."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "receiver",
                "serve",
                "--config",
                str(self.config),
                "--role",
                self.role,
                *self.args,
            ],
            cwd=self.cwd,
            env=env,
            stdout=log,
            stderr=log,
        )
        log.close()

    async def wait_ready(self, timeout: float = 20.0, *, ops_port: int | None = None) -> None:
        """Until ``/readyz`` answers 200 on the ops listener (``ops_port``: another process's)."""
        port = self.ops_port if ops_port is None else ops_port

        async def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"receiver exited early:\n{self.log()}")
            try:
                async with (
                    aiohttp.ClientSession() as s,
                    s.get(f"http://127.0.0.1:{port}/readyz") as r,
                ):
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await wait_for(ready, timeout, 0.1, "receiver readiness")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def stop_process(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGTERM a child still running, then SIGKILL it if it has not ended within ``timeout``."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


async def post_webhook(
    url: str, secret: str, payload: dict[str, Any], *, timestamp: int | None = None
) -> int:
    body = json.dumps(payload).encode()
    headers = webhook_headers(
        secret,
        body,
        timestamp or int(time.time()),
        event_id=payload.get("id"),
        event_name=payload.get("event"),
    )
    async with aiohttp.ClientSession() as s, s.post(url, data=body, headers=headers) as r:
        await r.read()
        return r.status
