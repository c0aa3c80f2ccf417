"""Store faults under a sender that retries like the upstream: a read-only database, a full disk,
another process holding the write lock.

While the fault lasts every answer is 503 (never a 2xx without a commit); when it clears the
receiver recovers by itself, without a restart; every event that got a 2xx is in the inbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.errors import StoreError
from receiver.ops import retention
from receiver.ops.retention import Retention
from receiver.store.retention_timing import Timing
from receiver.store.sqlite import SqliteStore
from tests.support.faults import SECRET, signed_post
from tests.support.store_cases import T0, new_event

SENDERS = 3
BUSY_TIMEOUT = 0.3  # how long a write waits for another process's lock (5 s by default)


@dataclass
class Answer:
    event_id: str
    sent: float
    answered: float
    status: int


@dataclass
class Traffic:
    """Senders posting distinct events, each again until it gets a 2xx, every answer recorded."""

    client: Any
    answers: list[Answer] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    stop_deadline: float = 0.0

    def finish(self, within: float = 10.0) -> None:
        """Send no new events; those in flight must get their 2xx ``within`` seconds."""
        self.stop_deadline = time.monotonic() + within
        self.stop.set()

    async def sender(self) -> None:
        while not self.stop.is_set():
            event_id = f"evt-{uuid.uuid4()}"
            payload = {
                "id": event_id,
                "object": "event",
                "event": "job.completed",
                "job_id": f"job-{event_id}",
            }
            while True:
                if self.stop.is_set() and time.monotonic() > self.stop_deadline:
                    raise AssertionError("the receiver did not recover after the fault cleared")
                body, headers = signed_post(payload)
                sent = time.monotonic()
                response = await self.client.post("/webhooks", data=body, headers=headers)
                await response.read()
                self.answers.append(Answer(event_id, sent, time.monotonic(), response.status))
                if 200 <= response.status < 300:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.01)

    def during(self, start: float, end: float) -> list[Answer]:
        """Answers to requests sent and answered while the fault lasted."""
        return [a for a in self.answers if a.sent >= start and a.answered <= end]

    def acknowledged(self) -> set[str]:
        return {a.event_id for a in self.answers if 200 <= a.status < 300}


@contextlib.asynccontextmanager
async def intake(aiohttp_client: Any, db: Path) -> AsyncIterator[tuple[Runtime, Traffic]]:
    settings = parse_settings(
        {
            "webhook": {"secrets": [SECRET]},
            "store": {"url": f"sqlite:///{db}"},
            "sinks": [{"name": "files", "type": "download", "directory": str(db.parent / "dl")}],
        },
        env={},
    )
    store = SqliteStore(settings.store, busy_timeout=BUSY_TIMEOUT)
    async with Runtime(settings, role="intake", store=store) as runtime:
        client = await aiohttp_client(runtime.public_app())
        yield runtime, Traffic(client)


async def run_fault(
    traffic: Traffic, start_fault: Any, clear_fault: Any, *, seconds: float = 1.5
) -> tuple[float, float]:
    """Senders running before, during and after the fault; returns the fault's window."""
    senders = [asyncio.create_task(traffic.sender()) for _ in range(SENDERS)]
    try:
        await asyncio.sleep(0.3)
        await start_fault()
        begun = time.monotonic()
        await asyncio.sleep(seconds)
        ended = time.monotonic()
        await clear_fault()
        await asyncio.sleep(0.5)
    finally:
        traffic.finish()
        await asyncio.gather(*senders)
    return begun, ended


async def check_nothing_lost(runtime: Runtime, traffic: Traffic) -> None:
    statuses = {a.status for a in traffic.answers}
    assert statuses <= {200, 503}, statuses
    sent = {a.event_id for a in traffic.answers}
    # Every sender's event ended in a 2xx (the loop only moves on after one) ...
    assert traffic.acknowledged() == sent
    # ... and every acknowledged event is in the inbox, once.
    for event_id in sent:
        assert await runtime.store.get(event_id) is not None, event_id
    counts, _ = await runtime.store.counts()
    assert sum(counts.values()) == len(sent)


def check_refused_during(traffic: Traffic, begun: float, ended: float) -> None:
    during = traffic.during(begun, ended)
    assert len(during) >= SENDERS, "no request was answered while the fault lasted"
    assert {a.status for a in during} == {503}, [a.status for a in during]


# -- another process holding the write lock ------------------------------------------------------

LOCK_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""


async def test_database_locked_by_another_process(aiohttp_client: Any, tmp_path: Path) -> None:
    db = tmp_path / "inbox.db"
    async with intake(aiohttp_client, db) as (runtime, traffic):
        connection = runtime.store._intake
        assert connection is not None
        holder: subprocess.Popen[str] | None = None

        async def lock() -> None:
            nonlocal holder
            holder = subprocess.Popen(
                [sys.executable, "-c", LOCK_HOLDER, str(db)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert holder.stdout is not None
            assert (await asyncio.to_thread(holder.stdout.readline)).strip() == "locked"

        async def unlock() -> None:
            assert holder is not None and holder.stdin is not None
            holder.stdin.write("\n")
            holder.stdin.flush()
            assert await asyncio.to_thread(holder.wait, 10) == 0

        try:
            # A refused group takes BUSY_TIMEOUT, and on a busy machine up to three times that:
            # a fault of 3 s lets several groups be refused within it, whatever the load.
            begun, ended = await run_fault(traffic, lock, unlock, seconds=3.0)
        finally:
            if holder is not None:
                if holder.poll() is None:
                    holder.kill()
                    holder.wait(10)
                for pipe in (holder.stdin, holder.stdout):
                    if pipe is not None:
                        pipe.close()
        check_refused_during(traffic, begun, ended)
        await check_nothing_lost(runtime, traffic)
        # A lock held elsewhere leaves the intake connection sound: it is kept, so each refusal
        # waits one busy timeout (reopening it would truncate the WAL, waiting a second one).
        assert runtime.store._intake is connection


# -- a read-only database -----------------------------------------------------------------------


def _chattr(flag: str, *paths: Path) -> bool:
    chattr = shutil.which("chattr")
    if chattr is None:
        return False
    done = subprocess.run([chattr, flag, *map(str, paths)], capture_output=True, check=False)
    return done.returncode == 0


async def test_database_made_read_only(aiohttp_client: Any, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a database read-only under an open connection needs root (chattr +i)")
    db = tmp_path / "inbox.db"
    # The database and its WAL become immutable (the -shm index stays writable: SQLite maps it,
    # and a write to a mapped read-only file is a SIGBUS, not an error it can report).
    files = (db, Path(f"{db}-wal"))
    async with intake(aiohttp_client, db) as (runtime, traffic):

        async def make_read_only() -> None:
            if not _chattr("+i", *files):
                pytest.skip("chattr +i is not permitted on this filesystem")

        async def make_writable() -> None:
            assert _chattr("-i", *files)

        try:
            begun, ended = await run_fault(traffic, make_read_only, make_writable)
        finally:
            _chattr("-i", *files)
        check_refused_during(traffic, begun, ended)
        await check_nothing_lost(runtime, traffic)


# -- a full disk ----------------------------------------------------------------------------------


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "16m") -> Iterator[Path]:
    """A tmpfs to fill up. Small, but several times the WAL's working size here (up to ~5 MB:
    a few pages a commit, ~300 commits a second, a checkpoint restarting it every second or
    500 events). On a disk whose free space is smaller than that, the WAL itself fills it
    again, and a checkpoint can then no longer grow the database file to restart the WAL."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill up needs root")
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill(directory: Path, name: str = "filler") -> Path:
    """Write a file until the filesystem has no space left."""
    filler = directory / name
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for size in (1 << 16, 1 << 9):  # then the last few bytes
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    return filler


async def test_disk_full(aiohttp_client: Any, tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "small") as fs:
        async with intake(aiohttp_client, fs / "inbox.db") as (runtime, traffic):
            filler: Path | None = None

            async def fill_up() -> None:
                nonlocal filler
                filler = await asyncio.to_thread(fill, fs)

            async def free() -> None:
                assert filler is not None
                filler.unlink()

            begun, ended = await run_fault(traffic, fill_up, free)
            during = traffic.during(begun, ended)
            # The WAL may still have room for a few events when the disk fills up (those are
            # committed and rightly acknowledged); after that, every answer is 503.
            assert any(a.status == 503 for a in during), [a.status for a in during]
            assert during[-SENDERS:] and {a.status for a in during[-SENDERS:]} == {503}
            await check_nothing_lost(runtime, traffic)


async def test_disk_full_during_a_vacuum(
    aiohttp_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills as the retention loop gives free pages back (and stays full: whatever
    filled it takes what the vacuum gave back too): the vacuum step fails, changing nothing, or
    completes; the inbox stays readable, intake answers 503 until space returns, then 2xx; the
    next cycle gives the space back."""
    monkeypatch.setattr(retention, "KEEP_FREE_BYTES", 0)
    with small_tmpfs(tmp_path / "small", size="48m") as fs:
        db = fs / "inbox.db"
        async with intake(aiohttp_client, db) as (runtime, traffic):
            store = runtime.store
            assert isinstance(store, SqliteStore)
            body = b"x" * 2000
            old = [new_event(f"old-{i}", received_at=T0, sinks=(), body=body) for i in range(4000)]
            await asyncio.gather(*(store.add_event(event) for event in old))
            assert await store.prune(older_than=T0 + 1) == len(old)
            space = await store.space()
            assert space is not None and space.free_bytes is not None
            assert space.free_bytes > 8_000_000
            loop = Retention(store, runtime.metrics, Timing(100.0, 3600.0), clock=time.time)
            fillers: list[Path] = []
            reclaim = store.reclaim_space
            vacuum: list[BaseException | int] = []

            def truncate_wal_then_fill(name: str) -> None:
                # The WAL emptied first: what is written next needs new space (a WAL that
                # keeps its size takes commits into it, rightly, even on a full disk).
                with closing(sqlite3.connect(db, timeout=5)) as conn:
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                fillers.append(fill(fs, name))

            async def filling_first(*, max_pages: int) -> int:
                if not fillers:  # the disk fills as the vacuum begins
                    await asyncio.to_thread(truncate_wal_then_fill, "filler")
                return await reclaim(max_pages=max_pages)

            monkeypatch.setattr(store, "reclaim_space", filling_first)

            async def fill_up() -> None:
                try:
                    vacuum.append(await loop.reclaim())
                except StoreError as exc:
                    vacuum.append(exc)
                # And it stays full: whatever filled it takes what the vacuum's attempt left
                # in the WAL, and what intake's commits into it meanwhile gave back.
                await asyncio.to_thread(truncate_wal_then_fill, "more")
                # Readable all the while.
                assert (await store.counts())[0]["pending"] >= 0

            async def free() -> None:
                for filler in fillers:
                    filler.unlink()

            begun, ended = await run_fault(traffic, fill_up, free)
            print(f"the vacuum on a full disk: {vacuum}")
            during = traffic.during(begun, ended)
            assert during[-SENDERS:] and {a.status for a in during[-SENDERS:]} == {503}
            await check_nothing_lost(runtime, traffic)
            monkeypatch.setattr(store, "reclaim_space", reclaim)
            await loop.reclaim()
            space = await store.space()
            assert space is not None and space.free_bytes is not None
            assert space.free_bytes < 1_000_000, space
            with closing(sqlite3.connect(db)) as conn:
                assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
