"""What only the SQLite inbox promises, healing after file-level faults: read-only files,
another process holding the write lock; and a path that cannot be opened, a file that is not a
database, or a store not opened, each StoreUnavailable.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from receiver.errors import StoreUnavailable
from receiver.store.sqlite import SqliteStore
from tests.support.sqlite_stores import new_event, opened, settings_for

# -- faults -------------------------------------------------------------------------------------


def _db_files(path: Path) -> list[Path]:
    candidates = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
    return [p for p in candidates if p.exists()]


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """Make the database files read-only for this process, even when it runs as root."""
    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if as_root:
        chattr = shutil.which("chattr")
        if chattr is None:
            pytest.skip("running as root without chattr: cannot make a file read-only")

        def set_immutable(flag: str) -> bool:
            done = subprocess.run(
                [chattr, flag, *map(str, _db_files(path))], capture_output=True, check=False
            )
            return done.returncode == 0

        if not set_immutable("+i"):
            pytest.skip("running as root and chattr +i is not permitted here")
        try:
            yield
        finally:
            set_immutable("-i")
    else:
        for p in _db_files(path):
            p.chmod(0o444)
        try:
            yield
        finally:
            # A read-only open may have created -wal/-shm copying the 0444 mode: restore all.
            for p in _db_files(path):
                p.chmod(0o644)


async def test_read_only_database_fails_then_recovers(tmp_path: Path) -> None:
    path = tmp_path / "inbox.db"
    async with opened(path) as store:
        await store.add_event(new_event("before"))

    store = SqliteStore(settings_for(path))
    try:
        with read_only(path):
            await store.open()  # reading still works on a read-only file
            assert await store.get("before") is not None
            with pytest.raises(StoreUnavailable, match="read-only") as info:
                await store.add_event(new_event("during"))
            assert type(info.value) is StoreUnavailable
            results = await asyncio.gather(
                *(store.add_event(new_event(f"batch-{i}")) for i in range(5)),
                return_exceptions=True,
            )
            assert all(isinstance(r, StoreUnavailable) for r in results)
        # Permissions are back: the next write reconnects and succeeds.
        assert await store.add_event(new_event("during")) is True
        assert await store.add_event(new_event("after")) is True
        assert await store.get("during") is not None
    finally:
        await store.close()


async def test_lock_held_by_another_connection_fails_fast_then_recovers(tmp_path: Path) -> None:
    path = tmp_path / "inbox.db"
    async with opened(path, busy_timeout=0.2) as store:
        await store.add_event(new_event("before"))
        blocker = sqlite3.connect(path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            started = time.monotonic()
            results = await asyncio.gather(
                *(store.add_event(new_event(f"ev-{i}")) for i in range(3)),
                return_exceptions=True,
            )
            assert time.monotonic() - started < 3.0
            assert all(isinstance(r, StoreUnavailable) for r in results), results
            assert "locked" in str(results[0])
            # WAL: readers are not blocked by the other writer.
            assert await store.get("before") is not None
            assert (await store.counts())[0]["pending"] == 1
            blocker.execute("COMMIT")
        finally:
            blocker.close()
        # The failed batch was rolled back, so those ids are new now.
        assert await store.add_event(new_event("ev-0")) is True
        assert (await store.counts())[0]["pending"] == 2


async def test_unopenable_path_is_store_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = SqliteStore(settings_for(blocker / "inbox.db"))
    with pytest.raises(StoreUnavailable):
        await store.open()


async def test_not_a_database_is_store_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "inbox.db"
    path.write_bytes(b"this is not a sqlite database at all" * 200)
    store = SqliteStore(settings_for(path))
    with pytest.raises(StoreUnavailable, match="not a SQLite database"):
        await store.open()


async def test_unopened_store_is_unavailable(tmp_path: Path) -> None:
    store = SqliteStore(settings_for(tmp_path / "inbox.db"))
    with pytest.raises(StoreUnavailable):
        await store.add_event(new_event("ev-1"))
    with pytest.raises(StoreUnavailable):
        await store.counts()
