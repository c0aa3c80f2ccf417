"""What ``make_inboxes.py`` does with one earlier version's receiver, on one backend.

The receiver (that version's code, its own process) gets signed webhooks from this script and
fetches their jobs from this checkout's simulator; its four http sinks are servers of this
script:

- ``ok`` answers 200: each event's delivery there ends done;
- ``flaky`` (``max_attempts = 2``) answers 500 for some events and 400 for others, 200 for the
  rest: those events end dead;
- ``down`` (``events = ["job.failed"]``) refuses connections the whole run: the failed jobs'
  events stay pending behind it;
- ``held`` (``events = ["job.failed"]``) answers 200; on version 7 its lane is paused
  (``receiver lanes pause``) halfway, so the later failed jobs wait there too.

From version 4 on, jobs that send no webhook are watched first (``receiver watch``), a few of
them finishing (their outcome is delivered like a webhook's), the rest still processing at the
stop. Then the webhooks; some done and some dead events are redelivered (``POST
/admin/events/{id}/redeliver``); on version 7 two redelivery batches are stored (``receiver
redeliver``): the done deliveries of ``held`` (queued onto the paused lane: the batch stays
running) and the dead ones of ``flaky`` (dead again: the batch ends done). Last, a burst of
webhooks whose jobs the upstream is too slow to answer, and SIGTERM while they are pending.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import random
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from old_receiver import OldReceiver, free_port, until

from receiver.simulator import Simulator

SECRET = "whsec_upgrade_inboxes_" + "5a" * 12
API_KEY = "service_" + "ab" * 32
SINK_SECRET = "upgrade-sink-secret-" + "7" * 16

DONE, DEAD_500, DEAD_400 = 140, 20, 10  # completed jobs, by what flaky answers
FAILED_BEFORE, FAILED_AFTER = 20, 20  # failed jobs, before and after held is paused
BURST = 20  # sent last, their jobs not fetched before the stop
REDELIVER_DONE, REDELIVER_DEAD = 10, 5
WATCH_KEPT, WATCH_COMPLETED = 6, 4  # watched jobs still processing at the stop, and finished
WATCH_EXPIRY_HOURS = 20 * 365 * 24.0  # still watched when the tests run, years later
PAUSE_REASON = "paused before the upgrade"


class Sink:
    """An HTTP sink's peer: counts what arrives by event id, answers by ``status_for``."""

    def __init__(self) -> None:
        self.received: Counter[str] = Counter()
        self.status_for: dict[str, int] = {}

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        event_id = request.headers.get("Service-Event-Id", "")
        self.received[event_id] += 1
        status = self.status_for.get(event_id, 200)
        return web.Response(status=status, text="" if status < 300 else "no")


class Scenario:
    """One version's receiver on one store, from the first webhook to its stop."""

    def __init__(
        self,
        version: int,
        run: Path,
        store: dict[str, Any],
        *,
        sqlite_path: Path | None = None,
        postgres: tuple[str, str] | None = None,
    ) -> None:
        self.version = version
        self.run = run
        self.store = store
        self.sqlite_path = sqlite_path
        self.postgres = postgres
        self.pg: Any = None
        self.lite: sqlite3.Connection | None = None
        self.sim = Simulator(api_key=API_KEY, seed=version, shape="full")
        self.sinks = {name: Sink() for name in ("ok", "flaky", "held")}
        self.runners: list[web.AppRunner] = []
        self.public_port = 0
        self.expected: Counter[str] = Counter()
        self.receiver: OldReceiver | None = None

    @staticmethod
    def sink_table() -> list[dict[str, Any]]:
        """The ``[[sinks]]`` every version gets (without url and secret)."""
        return [
            {"name": "ok", "type": "http"},
            {"name": "flaky", "type": "http", "max_attempts": 2},
            {"name": "down", "type": "http", "events": ["job.failed"]},
            {"name": "held", "type": "http", "events": ["job.failed"]},
        ]

    async def serve(self, app: web.Application) -> int:
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        self.runners.append(runner)
        return port

    async def config(self) -> dict[str, Any]:
        upstream = await self.serve(self.sim.create_app())
        self.sim.base_url = f"http://127.0.0.1:{upstream}/v1"
        urls = {"down": f"http://127.0.0.1:{free_port()}/in"}  # nothing listens there
        for name, sink in self.sinks.items():
            app = web.Application()
            app.router.add_post("/in", sink.handle)
            urls[name] = f"http://127.0.0.1:{await self.serve(app)}/in"
        self.public_port = free_port()
        config: dict[str, Any] = {
            "server": {
                "host": "127.0.0.1",
                "port": self.public_port,
                "shutdown_timeout_seconds": 2,
            },
            "webhook": {"secrets": [SECRET]},
            "api": {
                "base_url": self.sim.base_url,
                "api_key": API_KEY,
                "timeout_seconds": 5,
                "watchdog_interval_seconds": 0,
            },
            "store": {**self.store, "retention_hours": 24 * 365 * 20},
            "worker": {
                "concurrency": 8,
                "max_attempts": 100000,
                "backoff_initial_seconds": 0.05,
                "backoff_max_seconds": 1.0,
                "poll_interval_seconds": 0.2,
            },
            "admin": {"host": "127.0.0.1", "port": free_port()},
            "log": {"level": "warning", "format": "json"},
            "sinks": [
                {**s, "url": urls[s["name"]], "secret": SINK_SECRET} for s in self.sink_table()
            ],
        }
        if self.version >= 2:
            # flaky fails on purpose, again and again: its lane's circuit stays shut.
            config["worker"]["circuit_failures"] = 0
        if self.version >= 4:
            config["pull"] = {"wait_seconds": 1, "watch_expiry_hours": WATCH_EXPIRY_HOURS}
        return config

    async def rows(self, sql: str) -> list[tuple[Any, ...]]:
        if self.sqlite_path is not None:
            # One connection for the whole run, closed once the receiver has stopped. Versions
            # 4 to 7 lose their locks on the database file (their checkpointer opens and closes
            # a descriptor of it): a process that closed the last connection it saw would then
            # delete the WAL the receiver still writes into. This one's lock keeps the
            # commands of this script (watch, lanes, redeliver) from ever being that last one.
            if self.lite is None:
                self.lite = sqlite3.connect(self.sqlite_path, timeout=10)
            return [tuple(r) for r in self.lite.execute(sql).fetchall()]
        if self.pg is None:
            import asyncpg

            assert self.postgres is not None
            url, schema = self.postgres
            self.pg = await asyncpg.connect(url, server_settings={"search_path": schema})
        return [tuple(r) for r in await self.pg.fetch(sql)]

    async def wait(self, check: Callable[[], Awaitable[bool]], what: str) -> None:
        """:func:`until`, saying on a timeout where the inbox stands and what the receiver
        logged last."""

        async def explain() -> str:
            events = await self.rows("SELECT state, count(*) FROM events GROUP BY 1")
            deliveries = await self.rows(
                "SELECT sink, state, count(*) FROM deliveries GROUP BY 1, 2 ORDER BY 1, 2"
            )
            log = self.receiver.tail() if self.receiver is not None else ""
            watches = await self.rows("SELECT * FROM watches") if self.version >= 4 else []
            return (
                f"expected {dict(self.expected)}, events {events}\n{deliveries}\n"
                f"watches {watches}\n{log}"
            )

        await until(check, what, explain=explain)

    async def settled(self, held_paused: bool = False) -> bool:
        """Every event in its expected state, and nothing pending but at the sinks that cannot
        take it (``down``; ``held`` while paused)."""
        states = Counter(dict(await self.rows("SELECT state, count(*) FROM events GROUP BY 1")))
        waiting = ("down", "held") if held_paused else ("down",)
        marks = ", ".join(f"'{s}'" for s in waiting)
        [(busy,)] = await self.rows(
            f"SELECT count(*) FROM deliveries WHERE state = 'pending' AND sink NOT IN ({marks})"
        )
        return states == self.expected and busy == 0

    async def send(self, session: aiohttp.ClientSession, payload: dict[str, Any]) -> None:
        """One webhook, signed as the upstream signs (``Service-Signature: t=...,v1=...``)."""
        body = json.dumps(payload).encode()
        now = int(time.time())
        mac = hmac.new(SECRET.encode(), b"%d.%b" % (now, body), hashlib.sha256).hexdigest()
        headers = {
            "Content-Type": "application/json",
            "Service-Signature": f"t={now},v1={mac}",
            "X-Service-Timestamp": str(now),
            "Service-Event-Id": payload["id"],
            "X-Service-Event": payload["event"],
        }
        url = f"http://127.0.0.1:{self.public_port}/webhooks"
        async with session.post(url, data=body, headers=headers) as response:
            if response.status != 200:
                raise SystemExit(f"webhook answered {response.status}: {await response.text()}")

    async def send_all(self, session: aiohttp.ClientSession, payloads: list[Any]) -> None:
        gate = asyncio.Semaphore(8)

        async def one(payload: dict[str, Any]) -> None:
            async with gate:
                await self.send(session, payload)

        await asyncio.gather(*(one(p) for p in payloads))

    async def play(self, receiver: OldReceiver) -> dict[str, Any]:
        """Run the scenario; what it did (ids by role), once the receiver has stopped."""
        self.receiver = receiver
        receiver.configure(await self.config())
        await receiver.start()
        try:
            await self.rows("SELECT count(*) FROM events")  # the SQLite lock, before any command
            async with aiohttp.ClientSession() as session:
                did = await self.phases(receiver, session)
            did["exit_code"] = receiver.stop()
            return did
        finally:
            receiver.kill()
            if self.lite is not None:
                self.lite.close()
            if self.pg is not None:
                await self.pg.close()
            for runner in self.runners:
                await runner.cleanup()

    async def phases(self, receiver: OldReceiver, session: aiohttp.ClientSession) -> dict[str, Any]:
        sim, flaky, v7 = self.sim, self.sinks["flaky"], self.version >= 7
        did: dict[str, Any] = {}
        if self.version >= 4:
            did.update(await self.watch(receiver))
        pick = random.Random(self.version)
        done = [sim.add_job(pick.choice(["image", "animation", "logo"])) for _ in range(DONE)]
        dead = [sim.add_job("image") for _ in range(DEAD_500 + DEAD_400)]
        for n, payload in enumerate(dead):
            flaky.status_for[payload["id"]] = 500 if n < DEAD_500 else 400
        failed = [sim.add_job("failed") for _ in range(FAILED_BEFORE + FAILED_AFTER)]
        first = done + dead + failed[:FAILED_BEFORE]
        pick.shuffle(first)
        await self.send_all(session, first)
        self.expected.update(done=DONE, dead=len(dead), pending=FAILED_BEFORE)
        await self.wait(self.settled, "the first webhooks to settle")

        # Redelivered through the admin API: done ones (sent again), dead ones (dead again).
        again = [p["id"] for p in done[:REDELIVER_DONE]] + [p["id"] for p in dead[:REDELIVER_DEAD]]
        for event_id in again:
            async with session.post(receiver.ops(f"/admin/events/{event_id}/redeliver")) as r:
                if r.status != 200:
                    raise SystemExit(f"redeliver {event_id}: {r.status} {await r.text()}")
        ok = self.sinks["ok"]

        async def redelivered() -> bool:
            sent = all(ok.received[i] >= 2 for i in again[:REDELIVER_DONE]) and all(
                flaky.received[i] >= 4 for i in again[REDELIVER_DONE:]
            )
            return sent and await self.settled()

        await self.wait(redelivered, "the redeliveries")
        did["redelivered"] = sorted(again)
        if v7:
            receiver.command("lanes", "pause", "held", "--reason", PAUSE_REASON)
            did["paused"] = ["held"]
        await self.send_all(session, failed[FAILED_BEFORE:])
        self.expected["pending"] += FAILED_AFTER
        await self.wait(lambda: self.settled(held_paused=v7), "the failed jobs' events")
        if v7:
            did["batches"] = await self.batches(receiver)
        # The last webhooks: their jobs answer too late for this run.
        sim.latency_seconds = 30.0
        burst = [sim.add_job("image") for _ in range(BURST)]
        await self.send_all(session, burst)
        did["burst"] = sorted(p["id"] for p in burst)
        return did

    async def watch(self, receiver: OldReceiver) -> dict[str, Any]:
        """Jobs on the watch list: some finish (their outcome is delivered), some never do."""
        jobs = [
            self.sim.add_job("image", status="processing", webhook=False)["job_id"]
            for _ in range(WATCH_KEPT + WATCH_COMPLETED)
        ]
        receiver.command("watch", *jobs)
        finishing = jobs[WATCH_KEPT:]
        for job_id in finishing:
            self.sim.complete_job(job_id)
        self.expected["done"] += WATCH_COMPLETED
        marks = ", ".join(f"'{j}'" for j in finishing)

        async def finished() -> bool:
            [(open_,)] = await self.rows(
                f"SELECT count(*) FROM watches WHERE job_id IN ({marks}) AND state = 'watching'"
            )
            return open_ == 0 and await self.settled()

        await self.wait(finished, "the watched jobs that finish")
        return {"watched": sorted(jobs[:WATCH_KEPT]), "watched_finished": sorted(finishing)}

    async def batches(self, receiver: OldReceiver) -> dict[str, str]:
        """Version 7's redelivery batches: one left running behind the paused lane, one done."""
        held = receiver.command("redeliver", "--status", "done", "--sink", "held", "--detach")
        flaky = receiver.command("redeliver", "--status", "dead", "--sink", "flaky", "--detach")
        ids = {"held": held.split()[1].rstrip(":"), "flaky": flaky.split()[1].rstrip(":")}

        async def flaky_done() -> bool:
            [(state,)] = await self.rows(
                f"SELECT state FROM redeliveries WHERE id = '{ids['flaky']}'"
            )
            return state == "done" and await self.settled(held_paused=True)

        await self.wait(flaky_done, "the flaky sink's batch to end")
        return ids
