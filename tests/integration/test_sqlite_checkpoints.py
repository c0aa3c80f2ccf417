"""Checkpoints off the commit path: commits only append to the WAL, a connection of its own copies
it into the database file, and under constant load the WAL still restarts (stays bounded)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from receiver.config import StoreSettings
from receiver.store import NewEvent
from receiver.store.sqlite import SqliteStore
from tests.support.helpers import wait_for

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
    shutil.copyfile(db, copy)
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


async def test_the_checkpointer_syncs_the_pages_it_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages a background checkpoint copied are synced by it, off the commit path, not left for
    the writer's WAL-restarting checkpoint to flush while intake waits."""
    from receiver.store.sqlite import checkpoints as sqlite_checkpoints

    synced: list[str] = []
    real = sqlite_checkpoints.os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(sqlite_checkpoints.os, "fdatasync", fdatasync)
    db = tmp_path / "inbox.db"
    store = SqliteStore(StoreSettings(url=f"sqlite:///{db}"))
    await store.open()
    try:
        await asyncio.gather(*(store.add_event(event(n)) for n in range(600)))

        async def synced_once() -> bool:
            return str(db) in synced

        await wait_for(synced_once, 10, 0.05, "the checkpointer to sync the database file")
        assert events_in_main_file(db, tmp_path) == 600
    finally:
        await store.close()
