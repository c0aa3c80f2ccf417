"""Real peers for the sink tests: an HTTP capture server, and Redis/NATS servers of our own.

The machine's shared Redis, RabbitMQ and NATS serve most tests. To stop and restart a broker
mid-test without disturbing anyone else, :class:`LocalServer` runs a private ``redis-server`` or
``nats-server`` on a free port.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from receiver.events import Enriched
from tests.support.helpers import stop_process
from tests.support.services import require_tool, service_reachable


@dataclass
class Captured:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Capture:
    """An HTTP server that records every request and answers from a script.

    ``script`` holds ``(status, headers)`` answers used in order; once it is empty every request
    gets ``status`` (200). While ``hold`` is set, requests wait until it is released, and
    ``in_flight`` / ``max_in_flight`` show how many arrived at once. ``times`` holds each
    request's arrival time (``time.monotonic()``), in order.
    """

    def __init__(self) -> None:
        self.requests: list[Captured] = []
        self.script: list[tuple[int, dict[str, str]]] = []
        self.status = 200
        self.hold: asyncio.Event | None = None
        self.in_flight = 0
        self.max_in_flight = 0
        self.answers: list[int] = []
        self.times: list[float] = []  # time.monotonic() as each request arrived
        self.url = ""  # where the test serves it, set by the test

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    def most_in_window(self, seconds: float) -> int:
        """The most requests that arrived within any ``seconds`` (half-open): a pace check."""
        best, start = 0, 0
        for end, arrived in enumerate(self.times):
            while arrived - self.times[start] >= seconds:
                start += 1
            best = max(best, end - start + 1)
        return best

    def fail_times(self, count: int, status: int = 500) -> None:
        self.script.extend([(status, {})] * count)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.times.append(time.monotonic())
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.hold is not None:
                await self.hold.wait()
            self.requests.append(
                Captured(request.method, request.path_qs, dict(request.headers), body)
            )
            status, headers = self.script.pop(0) if self.script else (self.status, {})
            self.answers.append(status)
            return web.Response(status=status, headers=headers, text="" if status < 300 else "no")
        finally:
            self.in_flight -= 1


class LocalServer:
    """A private broker process on ``port`` that a test can stop and start again."""

    def __init__(self, argv: list[str], port: int, log: Path) -> None:
        self.argv = argv
        self.port = port
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def redis(cls, port: int, directory: Path) -> LocalServer:
        program = require_tool("redis-server", installed_by="apt-get install redis-server")
        argv = [program, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", str(directory), "--loglevel", "warning"]
        return cls(argv, port, directory / f"redis-{port}.log")

    @classmethod
    def nats(cls, port: int, directory: Path) -> LocalServer:
        program = require_tool("nats-server", installed_by="apt-get install nats-server")
        store = directory / f"nats-{port}"
        argv = [program, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)]
        return cls(argv, port, directory / f"nats-{port}.log")

    def start(self, timeout: float = 15.0) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while not service_reachable("127.0.0.1", self.port, timeout=0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{self.argv[0]} did not start:\n{self.log.read_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None


def enriched_event(
    *,
    event_id: str = "evt_1",
    event: str = "job.completed",
    job: dict[str, Any] | None = None,
    assets: tuple[dict[str, Any], ...] = (),
) -> Enriched:
    """A small enriched event for sink-level tests."""
    job = job or {
        "id": "job_1",
        "status": "completed" if event == "job.completed" else "failed",
        "type": "image_generation",
        "item_name": "happy wave",
        "collection_id": "col_1",
        "error": None if event == "job.completed" else "the provider refused the prompt",
    }
    return Enriched(
        event_id=event_id,
        event_name=event,
        payload={"id": event_id, "object": "event", "event": event, "job_id": job["id"]},
        job=job,
        assets=assets,
        files=(),
        received_at=1767225600.0,
        processed_at=1767225601.5,
    )
