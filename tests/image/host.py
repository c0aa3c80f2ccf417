"""What runs on the host around the containers: the simulator, a consumer, a load balancer.

- ``receiver simulate`` (the project's upstream stand-in, as a user runs it): serves the job and
  asset API the containers call and sends them signed webhooks with the upstream's retries.
- :class:`Consumer`: the endpoint of an ``http`` sink; checks each POST's signature and counts
  deliveries per event id (exactly once is then a count, not a guess).
- :class:`Balancer`: round-robin in front of several containers, as a Service or a proxy
  spreads webhooks; a stopped container is skipped.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from receiver.errors import SignatureError
from receiver.signature import verify
from tests.support.helpers import free_port, wait_for


class Simulator:
    """``receiver simulate`` in a subprocess, sending ``events`` webhooks to ``target``.

    It runs until stopped: the receivers still fetch jobs and files from its API after the
    last webhook was answered."""

    def __init__(self, workdir: Path, *, target: str, secret: str, events: int, rate: float):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = workdir / "simulator.log"
        self.argv = [
            *(sys.executable, "-m", "receiver", "simulate", "--port", str(self.port)),
            *("--target", target, "--secret", secret, "--events", str(events)),
            *("--rate", str(rate), "--duplicates", "0.1", "--time-scale", "0.001"),
        ]
        self.summary_url = f"http://127.0.0.1:{self.port}/_simulator/summary"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        log = self.log_path.open("ab")
        try:
            self.proc = await asyncio.create_subprocess_exec(*self.argv, stdout=log, stderr=log)
        finally:
            log.close()
        deadline = time.monotonic() + 20
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                try:
                    async with session.get(
                        f"{self.base_url.removesuffix('/v1')}/_simulator/summary"
                    ):
                        return
                except aiohttp.ClientError:
                    await asyncio.sleep(0.1)
        raise AssertionError(f"the simulator did not start:\n{self.log_path.read_text()}")

    async def settled(self, timeout: float) -> dict[str, Any]:
        """Wait until every event is generated and every delivery has ended; the summary."""
        summary: dict[str, Any] = {}

        async def done() -> bool:
            nonlocal summary
            status, body = await get(self.summary_url)
            summary = json.loads(body) if status == 200 else {}
            return bool(summary.get("settled"))

        await wait_for(done, timeout, 0.2, "the simulator's deliveries to end")
        return summary

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def serve_post(path: str, handler: Any, port: int) -> web.AppRunner:
    """A one-route server on 127.0.0.1:``port``; clean it up with the runner."""
    app = web.Application()
    app.router.add_post(path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


class Consumer:
    """An ``http`` sink's endpoint on the host: verified POSTs counted per event id."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/events"
        self.deliveries: Counter[str] = Counter()
        self.bad_signatures = 0
        self._runner: web.AppRunner | None = None

    async def _receive(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            verify(
                secrets=[self.secret],
                body=body,
                header=request.headers.get("Service-Signature"),
                now=time.time(),
                tolerance_seconds=300,
            )
        except SignatureError:
            self.bad_signatures += 1
            return web.Response(status=401)
        self.deliveries[request.headers.get("Service-Event-Id", "")] += 1
        return web.Response(status=204)

    async def start(self) -> None:
        self._runner = await serve_post("/events", self._receive, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class Balancer:
    """Round-robin HTTP proxy for webhooks: each request to the next container in turn."""

    def __init__(self, backends: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/webhooks"
        self.backends = backends
        self._next = itertools.cycle(backends)
        self.answers: Counter[str] = Counter()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def _forward(self, request: web.Request) -> web.Response:
        """To the next container; one that refuses the connection is skipped (as a proxy's
        next-upstream rule does); 502 when none answers, and the upstream retries later."""
        assert self._session is not None
        body = await request.read()
        headers = {
            name: value
            for name, value in request.headers.items()
            if name.lower().startswith(("service-", "x-service-", "content-type"))
        }
        for _ in range(len(self.backends)):
            backend = next(self._next)
            try:
                async with self._session.post(backend, data=body, headers=headers) as answer:
                    self.answers[f"{backend} {answer.status}"] += 1
                    return web.Response(status=answer.status, body=await answer.read())
            except aiohttp.ClientConnectionError:
                self.answers[f"{backend} unreachable"] += 1
        return web.Response(status=502)

    async def start(self) -> None:
        self._session = aiohttp.ClientSession()
        self._runner = await serve_post("/webhooks", self._forward, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()


async def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """GET ``url``: (status, body); (0, reason) when nothing answers."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.get(url) as response,
        ):
            return response.status, await response.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return 0, str(exc) or type(exc).__name__


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus family's samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        series, value = line.rsplit(" ", 1)
        if all(f'{key}="{want}"' in series for key, want in labels.items()):
            total += float(value)
    return total
