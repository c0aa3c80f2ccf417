"""Every command that changes the inbox, run as its own OS process beside ``receiver serve``.

The contract ("Command line"): each of ``events redeliver ID``, ``events redeliver --dead``,
``redeliver``, ``redeliver cancel``, ``lanes pause``/``resume``, ``watch`` and ``reconcile`` works
from its own process while ``receiver serve`` runs on the same store, SQLite included, and the
running receiver acts on it within ``worker.poll_interval_seconds``. Here the console script
(``receiver``, never a function call) runs each command several times in a row against
a ``receiver serve`` process of its own, on SQLite and on Postgres, and the effect is looked for
where a user sees it: the requests arriving at a capture server behind the sinks, and
``redeliver status`` reaching ``done``. Each effect must be seen within the poll interval plus a
margin, counted from the moment the command exited (0.00: before the command's process had
ended); the latencies are printed as one ``commands:`` line per test. On SQLite every test ends
by checking that the server still holds its lock on the database file and no deleted WAL.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from receiver.simulator import Simulator
from tests.support.cli import run_cli
from tests.support.faults import client_session
from tests.support.helpers import ReceiverProcess, free_port, wait_for, write_config
from tests.support.peers import Capture
from tests.support.pipeline import signed
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres
from tests.support.sqlite_files import deleted_inbox_files, locks_on
from tests.support.upstream import serve_upstream

SECRET = "whsec_commands_" + "3c" * 12
API_KEY = "service_" + "c0" * 32
POLL = 0.5  # worker.poll_interval_seconds
# What a command's effect may take beyond the poll interval: a claim, one send, the capture.
MARGIN = 2.5
REPEAT = 3  # each command, this many times in a row
QUIET = 3 * POLL  # how long nothing may arrive where nothing must (several polls)


@dataclass
class Stack:
    """One ``receiver serve`` process, the upstream it fetches from and the sinks' peers."""

    tmp: Path
    config: Path
    server: ReceiverProcess
    upstream: Simulator
    hook: Capture  # an http sink that answers 200
    flaky: Capture  # an http sink with max_attempts 1: a 500 makes its delivery dead
    session: aiohttp.ClientSession
    db: Path | None  # the SQLite inbox, None on Postgres
    latencies: dict[str, list[float]] = field(default_factory=dict)

    async def cli(self, *args: str) -> str:
        code, out, err = await run_cli(*args, "--config", str(self.config), cwd=self.tmp)
        assert code == 0, f"receiver {' '.join(args)} exited {code}: {err}"
        return out

    async def webhook(self, **job: Any) -> dict[str, Any]:
        payload = self.upstream.add_job("image", **job)
        body, headers = signed(payload, SECRET)
        url = f"http://127.0.0.1:{self.server.public_port}/webhooks"
        async with self.session.post(url, data=body, headers=headers) as response:
            assert response.status == 200, await response.text()
        return payload

    async def acted_on(self, what: str, done: Callable[[], Awaitable[bool]], since: float) -> None:
        """Wait for ``done`` within the poll interval plus the margin from ``since`` (when the
        command exited), and record how long it took."""
        await wait_for(done, POLL + MARGIN, 0.02, f"the receiver to act on `{what}`")
        self.latencies.setdefault(what, []).append(time.monotonic() - since)

    def assert_inbox_files_sound(self) -> None:
        """On SQLite: the server still holds its read lock on the database file and no
        descriptor of a deleted inbox file (a WAL another process deleted)."""
        if self.db is None:
            return
        assert self.server.proc is not None
        pid = self.server.proc.pid
        assert not deleted_inbox_files(pid, self.db)
        assert locks_on(pid, self.db), "the server holds no lock on its database file"

    async def dead_settled(self) -> None:
        """Until every attempt the flaky sink answered 500 is settled dead (the next command
        that selects dead deliveries sees them all)."""

        seen: dict[str, float] = {}

        async def settled() -> bool:
            url = f"http://127.0.0.1:{self.server.ops_port}/metrics"
            async with self.session.get(url) as response:
                text = await response.text()
            seen.clear()
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if (
                        sample.name == "receiver_sink_deliveries_total"
                        and sample.labels.get("sink") == "flaky"
                    ):
                        seen[sample.labels["outcome"]] = sample.value
            return seen.get("dead") == len(self.flaky.requests)

        try:
            await wait_for(settled, 20, 0.05, "the flaky sink's attempts to be settled dead")
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}: {len(self.flaky.requests)} requests at the sink, outcomes {seen}\n"
                f"{self.server.log()}"
            ) from None


def sent_ids(capture: Capture) -> list[str]:
    """The event ids of the requests ``capture`` received, in order (the default envelope)."""
    return [json.loads(r.body)["event"]["id"] for r in capture.requests]


def arrivals(capture: Capture) -> Callable[[int], Callable[[], Awaitable[bool]]]:
    def at_least(count: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return len(capture.requests) >= count

        return check

    return at_least


@pytest.fixture(params=["sqlite", "postgres"])
async def stack(request: Any, tmp_path: Path, aiohttp_server: Any) -> AsyncIterator[Stack]:
    upstream = await serve_upstream(aiohttp_server, api_key=API_KEY, seed=34)
    hook, flaky = Capture(), Capture()
    for capture in (hook, flaky):
        capture.url = str((await aiohttp_server(capture.app())).make_url("/in"))
    flaky.status = 500
    async with _store(request.param) as store:
        config = write_config(
            tmp_path / "config.toml",
            {
                "server": {"host": "127.0.0.1", "port": free_port(), "shutdown_timeout_seconds": 2},
                "admin": {"port": free_port()},
                "webhook": {"secrets": [SECRET]},
                "api": {"base_url": upstream.base_url, "api_key": API_KEY, "timeout_seconds": 10},
                "store": store,
                "worker": {
                    "poll_interval_seconds": POLL,
                    "backoff_initial_seconds": 0.1,
                    "backoff_max_seconds": 0.5,
                    # The flaky sink fails on purpose, again and again: its circuit stays shut.
                    "circuit_failures": 1000,
                },
                "pull": {"wait_seconds": 2},
                "log": {"format": "json", "level": "info"},
                "sinks": [
                    {"name": "hook", "type": "http", "url": hook.url, "secret": "h" * 24},
                    {
                        "name": "flaky",
                        "type": "http",
                        "url": flaky.url,
                        "secret": "f" * 24,
                        "max_attempts": 1,
                    },
                ],
            },
        )
        server = ReceiverProcess(config)
        server.start()
        try:
            await server.wait_ready()
            async with client_session() as session:
                db = tmp_path / "inbox.db" if request.param == "sqlite" else None
                stack = Stack(tmp_path, config, server, upstream, hook, flaky, session, db)
                yield stack
                stack.assert_inbox_files_sound()
            report = "  ".join(
                f"{what} {'/'.join(f'{t:.2f}' for t in times)} s"
                for what, times in stack.latencies.items()
            )
            print(f"\ncommands: {request.param}: {report}")
        finally:
            server.stop()


def _store(kind: str) -> Any:
    """The ``[store]`` table of one backend, in a context that cleans it up."""

    class Sqlite:
        async def __aenter__(self) -> dict[str, Any]:
            return {"url": "sqlite:///inbox.db"}

        async def __aexit__(self, *_: object) -> None:
            return None

    class Postgres:
        async def __aenter__(self) -> dict[str, Any]:
            require_postgres()
            self._schema = fresh_schema()
            name = await self._schema.__aenter__()
            return {"url": POSTGRES_URL, "schema": name, "pool_size": 4}

        async def __aexit__(self, *exc: object) -> None:
            await self._schema.__aexit__(None, None, None)

    return Sqlite() if kind == "sqlite" else Postgres()


async def dead_letters(stack: Stack, count: int = 3) -> list[dict[str, Any]]:
    """``count`` events, delivered to both sinks: done at the hook, dead at the flaky one."""
    events = [await stack.webhook() for _ in range(count)]
    await wait_for(arrivals(stack.hook)(count), 20, 0.05, "the first deliveries")
    await wait_for(arrivals(stack.flaky)(count), 20, 0.05, "the first (failing) attempts")
    await stack.dead_settled()
    return events


async def quiet(capture: Capture, count: int) -> None:
    """``capture`` still holds ``count`` requests after :data:`QUIET` seconds (several polls)."""
    await asyncio.sleep(QUIET)
    assert len(capture.requests) == count, f"{len(capture.requests) - count} sent meanwhile"


async def test_events_redeliver_one_event(stack: Stack) -> None:
    """Several in a row, to one sink: one more send each time."""
    first = (await dead_letters(stack))[0]["id"]
    for n in range(REPEAT):
        await stack.cli("events", "redeliver", first, "--sink", "hook")
        await stack.acted_on("events redeliver ID", arrivals(stack.hook)(4 + n), time.monotonic())
    assert sent_ids(stack.hook).count(first) == 1 + REPEAT


async def test_events_redeliver_every_dead_delivery(stack: Stack) -> None:
    """Every dead delivery attempted again (and dead again: the sink still answers 500)."""
    await dead_letters(stack)
    for n in range(REPEAT):
        await stack.cli("events", "redeliver", "--dead")
        done = arrivals(stack.flaky)(3 * (n + 2))
        await stack.acted_on("events redeliver --dead", done, time.monotonic())
        await stack.dead_settled()


async def test_redeliver_batches_are_sent_and_reach_done(stack: Stack) -> None:
    await dead_letters(stack)
    for n in range(REPEAT):
        out = await stack.cli("redeliver", "--status", "dead", "--sink", "flaky", "--detach")
        batch = batch_id(out)
        done = arrivals(stack.flaky)(3 * (n + 2))
        await stack.acted_on("redeliver", done, time.monotonic())
        await stack.dead_settled()

        async def finished(batch: str = batch) -> bool:
            return await batch_state(stack, batch) == "done"

        await wait_for(finished, 20, 0.2, f"batch {batch} to reach done")


async def test_lanes_pause_holds_and_resume_sends(stack: Stack) -> None:
    await dead_letters(stack, 1)
    for n in range(REPEAT):
        await stack.cli("lanes", "pause", "hook", "--reason", "drill")
        held = len(stack.hook.requests)
        for _ in range(2):
            await stack.webhook()
        # Fetched and sent to the other sink, so the paused lane could have sent them too.
        await wait_for(arrivals(stack.flaky)(3 + 2 * n), 20, 0.05, "the other sink's sends")
        await quiet(stack.hook, held)
        await stack.cli("lanes", "resume", "hook")
        await stack.acted_on("lanes resume", arrivals(stack.hook)(held + 2), time.monotonic())


async def test_redeliver_cancel_sends_nothing_more(stack: Stack) -> None:
    """A batch into a paused lane, cancelled, then the lane resumed: none of it is sent, and
    its deliveries are dead again (a later batch sends them)."""
    await dead_letters(stack)
    for _ in range(REPEAT):
        await stack.cli("lanes", "pause", "flaky")
        before = len(stack.flaky.requests)
        out = await stack.cli("redeliver", "--status", "dead", "--sink", "flaky", "--detach")
        batch = batch_id(out)
        await stack.cli("redeliver", "cancel", batch)
        await stack.cli("lanes", "resume", "flaky")
        await quiet(stack.flaky, before)
        assert await batch_state(stack, batch) == "cancelled"
    await stack.cli("redeliver", "--status", "dead", "--sink", "flaky", "--detach")
    await stack.acted_on("redeliver after cancels", arrivals(stack.flaky)(6), time.monotonic())


async def test_watch_follows_a_job_that_sends_no_webhook(stack: Stack) -> None:
    for n in range(REPEAT):
        job = stack.upstream.add_job("image", webhook=False)
        await stack.cli("watch", job["job_id"])
        await stack.acted_on("watch", arrivals(stack.hook)(n + 1), time.monotonic())


async def test_reconcile_delivers_what_no_event_delivered(stack: Stack) -> None:
    for _ in range(REPEAT):
        collection = stack.upstream.new_id()
        for _ in range(2):
            stack.upstream.add_job("image", collection_id=collection, webhook=False)
        count = len(stack.hook.requests)
        await stack.cli("reconcile", "--collection", collection)
        await stack.acted_on("reconcile", arrivals(stack.hook)(count + 1), time.monotonic())


def batch_id(output: str) -> str:
    """The batch id ``receiver redeliver`` printed (``batch ID: ...``)."""
    words = output.split()
    assert words[:1] == ["batch"], output
    return words[1].rstrip(":")


async def batch_state(stack: Stack, batch: str) -> str:
    state: str = json.loads(await stack.cli("redeliver", "status", batch, "--json"))["state"]
    return state
