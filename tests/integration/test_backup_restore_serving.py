"""``receiver backup`` beside a ``receiver serve`` under a steady webhook load, and ``receiver
restore`` refused while it serves, then after it stopped: each command as its own process, the
receiver as its own, its http sink pointed at a capture server, the upstream a stand-in.

- Every event answered 2xx before the backup command started is in the copy; every webhook
  answered while it ran was answered 2xx, and deliveries went on.
- A restore while the receiver serves is refused with one line; the database and its WAL are
  byte for byte as before, and the receiver goes on taking webhooks.
- Restored, the receiver sends nothing again that the copy records as delivered, and delivers
  what the copy holds as pending.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from receiver.simulator import Simulator
from receiver.store import sqlite as sqlite_store
from receiver.store.sqlite.restore import claimed
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import ReceiverProcess, free_port, wait_for, write_config
from tests.support.old_inbox import make_sqlite_inbox
from tests.support.peers import Capture
from tests.support.pipeline import signed
from tests.support.sqlite_files import deleted_inbox_files, locks_on
from tests.support.upstream import serve_upstream

SECRET = "whsec_backup_" + "5e" * 12
API_KEY = "service_" + "b4" * 32
PER_SECOND = 40  # the webhook load while the backup runs
PREFILL = 20_000  # events already delivered: a copy that takes a moment
LATEST = sqlite_store.SCHEMA_VERSION


@dataclass
class Served:
    """A ``receiver serve`` process on ``db``, its upstream and its http sink's capture."""

    tmp: Path
    config: Path
    db: Path
    server: ReceiverProcess
    upstream: Simulator
    hook: Capture
    session: aiohttp.ClientSession
    answers: list[tuple[float, str, int]] = field(default_factory=list)  # (when, id, status)

    async def webhook(self) -> str:
        """POST one signed webhook; its event id (its answer is kept in ``answers``)."""
        payload = self.upstream.add_job("image")
        body, headers = signed(payload, SECRET)
        url = f"http://127.0.0.1:{self.server.public_port}/webhooks"
        async with self.session.post(url, data=body, headers=headers) as response:
            await response.read()
            self.answers.append((time.monotonic(), payload["id"], response.status))
        return str(payload["id"])

    def delivered(self) -> Counter[str]:
        """How many times the sink answered 200 for each event id."""
        return Counter(
            json.loads(request.body)["event"]["id"]
            for request, status in zip(self.hook.requests, self.hook.answers, strict=False)
            if status == 200
        )

    def deliveries(self, path: Path | None = None) -> dict[str, str]:
        """Each event's delivery state in the inbox (or a copy of it), read as another process
        reads it: through SQLite."""
        with closing(sqlite3.connect(path or self.db)) as conn:
            rows = conn.execute("SELECT event_id, state FROM deliveries WHERE sink = 'hook'")
            return dict(rows.fetchall())

    def assert_lock_held(self) -> None:
        """The server still holds its lock on the database file and no deleted WAL."""
        assert self.server.proc is not None
        assert locks_on(self.server.proc.pid, self.db), "the server lost its lock"
        assert not deleted_inbox_files(self.server.proc.pid, self.db)


def prefill(db: Path, count: int) -> None:
    """An inbox holding ``count`` events delivered a moment ago (nothing for the receiver to
    do with them)."""
    make_sqlite_inbox(db, LATEST, events=0)
    now = time.time()
    body = json.dumps({"padding": "x" * 1000}).encode()
    with closing(sqlite3.connect(db)) as conn:
        conn.executemany(
            "INSERT INTO events (id, event, job_id, body, headers, received_at, state) "
            "VALUES (?, 'job.completed', ?, ?, '{}', ?, 'done')",
            ((f"old-{n:06d}", f"job-{n}", body, now) for n in range(count)),
        )
        conn.commit()


@pytest.fixture
async def served(tmp_path: Path, aiohttp_server: Any) -> AsyncIterator[Served]:
    upstream = await serve_upstream(aiohttp_server, api_key=API_KEY, seed=41)
    hook = Capture()
    hook.url = str((await aiohttp_server(hook.app())).make_url("/in"))
    db = tmp_path / "inbox.db"
    config = write_config(
        tmp_path / "config.toml",
        {
            "server": {"host": "127.0.0.1", "port": free_port(), "shutdown_timeout_seconds": 2},
            "admin": {"port": free_port()},
            "webhook": {"secrets": [SECRET]},
            "api": {"base_url": upstream.base_url, "api_key": API_KEY, "timeout_seconds": 10},
            "store": {"url": f"sqlite:///{db}"},
            "worker": {
                "poll_interval_seconds": 0.2,
                "backoff_initial_seconds": 0.1,
                "backoff_max_seconds": 0.5,
                "max_attempts": 1000,
                "circuit_failures": 1000,  # a sink failing on purpose stays in reach
            },
            "log": {"format": "json", "level": "info"},
            "sinks": [{"name": "hook", "type": "http", "url": hook.url, "secret": "k" * 24}],
        },
    )
    server = ReceiverProcess(config)
    async with aiohttp.ClientSession() as session:
        stack = Served(tmp_path, config, db, server, upstream, hook, session)
        try:
            yield stack
        finally:
            server.stop()


async def start(stack: Served) -> None:
    stack.server.start()
    await stack.server.wait_ready()


async def test_a_backup_under_load_holds_every_event_answered_before_it_began(
    served: Served,
) -> None:
    prefill(served.db, PREFILL)
    await start(served)
    stopping = asyncio.Event()

    async def load() -> None:
        due = time.monotonic()
        while not stopping.is_set():
            await served.webhook()
            due += 1 / PER_SECOND
            await asyncio.sleep(max(0.0, due - time.monotonic()))

    sender = asyncio.create_task(load())
    try:
        await wait_for(_count(served.answers, 60), what="a second and a half of load")
        acknowledged = {event for _t, event, status in served.answers if status // 100 == 2}
        began = time.monotonic()
        copy = served.tmp / "backups"
        copy.mkdir()
        code, out, err = await run_cli(
            "backup", "--config", str(served.config), str(copy), "--progress"
        )
        ended = time.monotonic()
        assert code == 0, err
        after = len(served.answers)
        await wait_for(_count(served.answers, after + 40), what="the load to go on after it")
    finally:
        stopping.set()
        await sender
    (path,) = copy.iterdir()
    assert out.startswith(f"backup {path}: ")
    # Only progress lines (one a second, if the copy took that long) on stderr.
    assert all(re.fullmatch(r"receiver backup: .* copied \(\d+%\)", x) for x in err.splitlines())
    with closing(sqlite3.connect(path)) as conn:
        in_copy = {event for (event,) in conn.execute("SELECT id FROM events")}
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert acknowledged <= in_copy, sorted(acknowledged - in_copy)[:5]
    assert len(in_copy) >= PREFILL + len(acknowledged)

    statuses = Counter(status for _t, _event, status in served.answers)
    during = [status for t, _event, status in served.answers if began <= t <= ended]
    arrived = [t for t in served.hook.times if began <= t <= ended]
    assert set(statuses) == {200}, statuses
    assert len(during) >= 5, "no webhook was answered while the backup ran"
    assert arrived, "no delivery reached the sink while the backup ran"
    served.assert_lock_held()
    print(
        f"\nbackup under load: {len(served.answers)} webhooks, all 200; {len(during)} answered "
        f"and {len(arrived)} delivered during the backup ({ended - began:.2f} s, "
        f"{path.stat().st_size} bytes); {len(acknowledged)} acknowledged before it, all in it"
    )


async def test_restore_is_refused_while_serving_and_restored_sends_nothing_twice(
    served: Served,
) -> None:
    await start(served)
    first = [await served.webhook() for _ in range(20)]
    await wait_for(_states(served, first, "done"), 30, what="the first events delivered")
    # The sink fails from here: these stay pending, retried.
    served.hook.status = 500
    pending = [await served.webhook() for _ in range(10)]
    await wait_for(_attempted(served, pending), 30, what="each pending event tried once")
    backup = served.tmp / "backup.db"
    code, _out, err = await run_cli("backup", "--config", str(served.config), str(backup))
    assert code == 0, err
    in_copy = served.deliveries(backup)
    done_in_copy = {event for event, state in in_copy.items() if state == "done"}
    pending_in_copy = {event for event, state in in_copy.items() if state == "pending"}
    assert set(first) <= done_in_copy and set(pending) <= pending_in_copy

    # While the receiver serves, a restore is refused and changes nothing.
    served.hook.status = 200
    await wait_for(_states(served, first + pending, "done"), 30, what="everything delivered")
    await wait_for(_quiet(served.db), 30, 0.5, "the inbox files to stop changing")
    before = _data_files(served.db)
    code, out, err = await run_cli("restore", "--config", str(served.config), str(backup))
    assert (code, out.splitlines()[1:]) == (1, []), err
    assert_one_clean_line(err)
    assert f"the inbox {served.db} is in use by another process" in err
    assert _data_files(served.db) == before
    assert not list(served.tmp.glob("inbox.db.*"))  # nothing moved aside, nothing staged
    served.assert_lock_held()
    late = await served.webhook()
    assert served.answers[-1][2] == 200
    await wait_for(_states(served, [late], "done"), 30, what="the webhook after the refusal")

    # Stopped, restored, started again.
    assert served.server.terminate() == 0
    sent = served.delivered()
    code, out, err = await run_cli("restore", "--config", str(served.config), str(backup))
    assert code == 0, err
    assert "put a copy of" in out
    await start(served)
    await wait_for(
        _states(served, sorted(pending_in_copy), "done"), 30, what="the copy's pending delivered"
    )
    now = served.delivered()
    for event in done_in_copy:
        assert now[event] == sent[event], f"{event} was delivered again"
    for event in pending_in_copy:
        assert now[event] >= sent[event] + 1, f"{event} was not delivered after the restore"
    assert late not in served.deliveries() and now[late] == sent[late] == 1
    code, out, err = await run_cli("events", "list", "--config", str(served.config))
    assert code == 0, err
    assert first[-1] in out or pending[-1] in out
    served.assert_lock_held()


def test_while_a_restore_holds_the_inbox_a_receiver_does_not_start_on_it(tmp_path: Path) -> None:
    """The claim's lock, held by this process as ``receiver restore`` holds it during the
    swap: a ``receiver serve`` started meanwhile exits 1 with one line, and its inbox is left
    as the claim put it (out of WAL mode, no -wal or -shm)."""
    db = tmp_path / "inbox.db"
    make_sqlite_inbox(db, LATEST, events=3)
    config = write_config(
        tmp_path / "config.toml",
        {
            "server": {"host": "127.0.0.1", "port": free_port()},
            "admin": {"port": free_port()},
            "webhook": {"secrets": [SECRET]},
            "store": {"url": f"sqlite:///{db}"},
        },
    )
    lines: list[str] = []
    with claimed(db, lines.append):
        done = subprocess.run(
            [sys.executable, "-m", "receiver", "serve", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("inbox.db-")) in (
            [],
            ["inbox.db-writer"],
        )
    assert lines == [f"claimed {db}: no other process has it open; it stays locked until restored"]
    assert done.returncode == 1, done.stderr
    assert_one_clean_line(done.stderr)
    assert "is locked by another writer" in done.stderr


def _count(answers: list[Any], n: int) -> Any:
    async def check() -> bool:
        return len(answers) >= n

    return check


def _states(served: Served, events: list[str], state: str) -> Any:
    async def check() -> bool:
        states = served.deliveries()
        return all(states.get(event) == state for event in events)

    return check


def _attempted(served: Served, events: list[str]) -> Any:
    async def check() -> bool:
        tried = {json.loads(r.body)["event"]["id"] for r in served.hook.requests}
        return set(events) <= tried

    return check


def _data_files(db: Path) -> dict[str, bytes]:
    """The database and its WAL, byte for byte (the -shm is shared memory every reader
    touches)."""
    return {
        path.name: path.read_bytes()
        for path in (db, db.with_name(db.name + "-wal"))
        if path.exists()
    }


def _quiet(db: Path) -> Any:
    last: list[dict[str, bytes]] = []

    async def check() -> bool:
        now = _data_files(db)
        same = bool(last) and last[-1] == now
        last.append(now)
        return same

    return check
