"""Checkpoints off the commit path: commits only append to the WAL, a connection of its own copies
it into the database file, and under constant load the WAL still restarts (stays bounded)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from receiver.config.settings import StoreSettings
from receiver.store import NewEvent
from receiver.store.sqlite import SqliteStore
from tests.support.helpers import wait_for
from tests.support.sqlite_files import deleted_inbox_files, locks_on

BODY = b"x" * 800


def event(n: int) -> NewEvent:
    return NewEvent(
        id=f"evt-{n:06d}",
        event="job.completed",
        job_id=f"job-{n}",
        body=BODY,
        headers={},
        received_at=1_700_000_000.0 + n,
        sinks=("files",),
    )


def events_in_main_file(db: Path, scratch: Path) -> int:
    """Events in the database file alone, as if its WAL were lost (a copy without the WAL)."""
    copy = scratch / "main-only.db"
    # Copied by another process: a descriptor of the inbox opened and closed here would drop
    # this process's SQLite locks on it (see the test of that below).
    subprocess.run(["cp", str(db), str(copy)], check=True)
    with closing(sqlite3.connect(copy)) as conn:
        try:
            return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
        except sqlite3.DatabaseError:
            return 0
        finally:
            for suffix in ("-wal", "-shm"):
                Path(f"{copy}{suffix}").unlink(missing_ok=True)


async def test_commits_leave_checkpoints_to_the_background(tmp_path: Path) -> None:
    db = tmp_path / "inbox.db"
    store = SqliteStore(StoreSettings(url=f"sqlite:///{db}"))
    await store.open()
    try:
        for start in range(0, 2000, 100):
            await asyncio.gather(*(store.add_event(event(n)) for n in range(start, start + 100)))

        async def copied() -> bool:
            return events_in_main_file(db, tmp_path) == 2000

        # Commits never checkpoint (see below): only the checkpointer can have copied it over.
        await wait_for(copied, 10, 0.05, "the checkpointer to copy the WAL into the file")
    finally:
        await store.close()


async def test_commits_never_checkpoint_but_finish_a_long_wal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No background checkpointer: whatever reaches the database file, a commit put there.
    async def no_checkpoints(self: SqliteStore) -> None:
        return None

    monkeypatch.setattr(SqliteStore, "_checkpointer_main", no_checkpoints)
    db = tmp_path / "inbox.db"
    store = SqliteStore(StoreSettings(url=f"sqlite:///{db}"))
    await store.open()
    try:
        for start in range(0, 3000, 100):
            await asyncio.gather(*(store.add_event(event(n)) for n in range(start, start + 100)))
        # Thousands of WAL pages, and no commit copied any of them (SQLite's default would have).
        assert events_in_main_file(db, tmp_path) == 0
        # Once the checkpointer reports a long WAL, the next commit finishes the checkpoint
        # (so that the WAL can restart even if the load never pauses).
        store._wal_long = True
        await store.add_event(event(3000))

        async def finished() -> bool:  # right after the commit's callers were answered
            return events_in_main_file(db, tmp_path) == 3001

        await wait_for(finished, 10, 0.02, "the writer to finish the checkpoint")
        assert store._wal_long is False
    finally:
        await store.close()


async def test_another_process_closing_the_file_leaves_our_wal_alone(tmp_path: Path) -> None:
    """Once the background checkpoint has copied pages into the database file, other processes
    opening and closing the inbox (the commands an operator runs) must not find this process
    gone: SQLite's last connection deletes the WAL, and every later commit of this process would
    go to a deleted file. That happened while the checkpointer synced the file through a
    descriptor of its own, whose close dropped this process's locks on it."""
    db = tmp_path / "inbox.db"
    store = SqliteStore(StoreSettings(url=f"sqlite:///{db}"))
    await store.open()
    try:
        empty = db.stat().st_size
        await asyncio.gather(*(store.add_event(event(n)) for n in range(600)))

        async def checkpointed() -> bool:
            return db.stat().st_size > empty  # the checkpointer copied pages into the file

        await wait_for(checkpointed, 10, 0.02, "the background checkpoint")
        for _ in range(3):
            assert count_from_another_process(db) >= 600
            assert Path(f"{db}-wal").exists()
            assert not deleted_inbox_files("self", db)
            assert locks_on(os.getpid(), db), "this process lost its lock on the file"
        await asyncio.gather(*(store.add_event(event(n)) for n in range(600, 700)))
        assert count_from_another_process(db) == 700
    finally:
        await store.close()


def count_from_another_process(db: Path) -> int:
    """``SELECT count(*) FROM events`` in a process of its own, which opens and closes the file."""
    script = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
        "print(c.execute('SELECT count(*) FROM events').fetchone()[0]); c.close()"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(db)], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


async def test_the_checkpointer_syncs_what_it_copies_through_sqlites_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages a background checkpoint copied are synced by it, off the commit path (not left for
    the writer's WAL-restarting checkpoint to flush while intake waits), through a descriptor
    SQLite holds: the store never opens the file itself."""
    from receiver.store.sqlite import file_sync

    synced: list[str] = []
    real = file_sync.os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(file_sync.os, "fdatasync", fdatasync)
    db = tmp_path / "inbox.db"
    store = SqliteStore(StoreSettings(url=f"sqlite:///{db}"))
    await store.open()
    try:
        await asyncio.gather(*(store.add_event(event(n)) for n in range(600)))

        async def synced_once() -> bool:
            return str(db) in synced

        await wait_for(synced_once, 10, 0.05, "the checkpointer to sync the database file")
        assert locks_on(os.getpid(), db), "this process lost its lock on the file"
        assert count_from_another_process(db) == 600
        assert Path(f"{db}-wal").exists()
    finally:
        await store.close()


def test_file_sync_needs_a_descriptor_sqlite_holds(tmp_path: Path) -> None:
    """Without a connection of this process on the file there is nothing to sync through (and
    nothing is opened to make one); with one, the sync leaves its locks in place."""
    from receiver.store.sqlite.file_sync import FileSync

    db = tmp_path / "inbox.db"
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = wal")
        conn.execute("CREATE TABLE t (x)")
        conn.execute("INSERT INTO t VALUES (1)")
        held = locks_on(os.getpid(), db)
        assert held
        assert FileSync(db).sync() is True
        assert locks_on(os.getpid(), db) == held
    assert FileSync(db).sync() is False
