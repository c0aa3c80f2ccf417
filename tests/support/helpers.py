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


# Ports a test hands to a process it starts come from a range of this worker's own, below the
# kernel's ephemeral range (32768-60999 by default): a port taken from the ephemeral range can be
# given to an outgoing connection or to a port-0 listener of another worker in the time between
# choosing it and the process binding it.
_PORTS_FIRST, _PORTS_PER_WORKER = 12000, 2500
_next_port: list[int] = []


def _worker_index() -> int:
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


def free_port() -> int:
    """A port nothing listens on, from this test worker's own range (in turn, wrapping)."""
    first = _PORTS_FIRST + (_worker_index() % 8) * _PORTS_PER_WORKER
    if not _next_port:
        # A random start: two test sessions at once (rare) rarely walk the same ports together.
        _next_port.append(first + int.from_bytes(os.urandom(2)) % _PORTS_PER_WORKER)
    for _ in range(_PORTS_PER_WORKER):
        port = _next_port[0]
        _next_port[0] = first + (port + 1 - first) % _PORTS_PER_WORKER
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise AssertionError(f"no free port in {first}..{first + _PORTS_PER_WORKER - 1}")


def adjacent_free_ports() -> int:
    """A free port p with p + 1 free too (e.g. the ops listeners of ``--processes 2``); neither
    is handed out again by :func:`free_port` soon after."""
    port = free_port()
    for _ in range(50):
        following = free_port()
        if following == port + 1:
            return port
        port = following
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
