"""What only the SQLite inbox promises, how it commits: WAL with synchronous FULL (or NORMAL on
request, and for the workers' record of their progress, on a connection of its own), and group
commit: concurrent adds share commits (split by the batch cap), a duplicate or an event SQLite
refuses in a group is judged alone, and closing, a cancelled caller or a reopen lose nothing.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from receiver.errors import StoreUnavailable
from receiver.store.sqlite import SqliteStore
from tests.support.sqlite_stores import T0, new_event, opened, settings_for

# -- pragmas and group commit -------------------------------------------------------------------


async def test_wal_and_synchronous_full_by_default(tmp_path: Path) -> None:
    async with opened(tmp_path / "inbox.db", busy_timeout=1.5) as store:
        pragmas = await store.pragmas()
    assert pragmas["journal_mode"] == "wal"
    assert pragmas["synchronous"] == "full"
    assert pragmas["foreign_keys"] is True
    assert pragmas["busy_timeout_ms"] == 1500
    assert pragmas["temp_store"] == "memory"  # statement journals never go to temporary files
    with sqlite3.connect(tmp_path / "inbox.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # kept in the file
    conn.close()


async def test_synchronous_normal_option(tmp_path: Path) -> None:
    async with opened(tmp_path / "inbox.db", synchronous="normal") as store:
        assert (await store.pragmas())["synchronous"] == "normal"


async def synchronous_of(conn: object) -> int:
    ((level,),) = await conn.execute_fetchall("PRAGMA synchronous")  # type: ignore[attr-defined]
    return int(level)


async def test_worker_progress_commits_without_waiting_for_the_disk(tmp_path: Path) -> None:
    """Intake and what an operator asks for commit with synchronous FULL; the workers' record of
    their progress (claims, settles, ...) with NORMAL, on a connection of its own."""
    async with opened(tmp_path / "inbox.db") as store:
        assert await store.add_event(new_event("ev-1"))
        await store.claim_watches(owner="w", limit=1, lease_seconds=10, now=T0)
        assert store._progress is not None and store._work is not None
        assert await synchronous_of(store._progress) == 1  # NORMAL
        assert await synchronous_of(store._work) == 2  # FULL
        assert await synchronous_of(store._intake) == 2
        progress = store._progress
        store._progress = None  # a durable write must not use it
        await store.pause_lane("alpha", until=None, reason="maintenance", now=T0)
        assert store._progress is None
        store._progress = progress
        assert (await store.lane_states())["alpha"].hold_reason == "maintenance"


async def test_synchronous_normal_needs_no_progress_connection(tmp_path: Path) -> None:
    async with opened(tmp_path / "inbox.db", synchronous="normal") as store:
        await store.claim_watches(owner="w", limit=1, lease_seconds=10, now=T0)
        assert store._progress is None and store._work is not None
        assert await synchronous_of(store._work) == 1


async def test_concurrent_adds_share_commits(tmp_path: Path) -> None:
    async with opened(tmp_path / "inbox.db") as store:
        before = store.commit_count
        results = await asyncio.gather(*(store.add_event(new_event(f"ev-{i}")) for i in range(500)))
        commits = store.commit_count - before
        assert all(results)
        assert 1 <= commits <= 10, commits
        assert (await store.counts())[0]["pending"] == 500


async def test_batch_cap_splits_transactions(tmp_path: Path) -> None:
    async with opened(tmp_path / "inbox.db", max_batch=100) as store:
        before = store.commit_count
        await asyncio.gather(*(store.add_event(new_event(f"ev-{i}")) for i in range(450)))
        assert store.commit_count - before >= 5


async def test_duplicate_within_one_batch_is_new_once(tmp_path: Path) -> None:
    async with opened(tmp_path / "inbox.db") as store:
        results = await asyncio.gather(*(store.add_event(new_event("same")) for _ in range(5)))
    assert sorted(results) == [False, False, False, False, True]


async def test_an_event_sqlite_refuses_fails_alone_in_its_group(tmp_path: Path) -> None:
    """A value SQLite cannot bind (here a job id that is not text) fails that caller only;
    the rest of its group is committed."""
    bad = new_event("ev-bad")
    object.__setattr__(bad, "job_id", {"not": "text"})
    async with opened(tmp_path / "inbox.db") as store:
        before = store.commit_count
        results = await asyncio.gather(
            *(store.add_event(new_event(f"ev-{i}")) for i in range(5)),
            store.add_event(bad),
            *(store.add_event(new_event(f"ev-{i}")) for i in range(5, 10)),
            return_exceptions=True,
        )
        assert store.commit_count - before == 1  # one group, written one event at a time
        assert isinstance(results[5], StoreUnavailable), results[5]
        assert results[:5] + results[6:] == [True] * 10
        assert await store.get("ev-bad") is None
        assert (await store.counts())[0]["pending"] == 10
        assert await store.add_event(new_event("ev-after")) is True


async def test_close_finishes_queued_adds(tmp_path: Path) -> None:
    path = tmp_path / "inbox.db"
    store = SqliteStore(settings_for(path))
    await store.open()
    tasks = [asyncio.create_task(store.add_event(new_event(f"ev-{i}"))) for i in range(50)]
    await asyncio.sleep(0)  # let every task enqueue its event
    await store.close()
    assert all(await asyncio.gather(*tasks))

    async with opened(path) as reopened:
        assert (await reopened.counts())[0]["pending"] == 50
    with pytest.raises(StoreUnavailable):
        await store.add_event(new_event("late"))


async def test_a_cancelled_caller_does_not_break_the_writer(tmp_path: Path) -> None:
    async with opened(tmp_path / "inbox.db") as store:
        doomed = asyncio.create_task(store.add_event(new_event("ev-cancelled")))
        others = [asyncio.create_task(store.add_event(new_event(f"ev-{i}"))) for i in range(10)]
        await asyncio.sleep(0)
        doomed.cancel()
        assert all(await asyncio.gather(*others))
        with pytest.raises(asyncio.CancelledError):
            await doomed
        assert await store.add_event(new_event("ev-after")) is True


async def test_the_same_instance_can_be_reopened(tmp_path: Path) -> None:
    store = SqliteStore(settings_for(tmp_path / "inbox.db"))
    await store.open()
    await store.add_event(new_event("ev-1"))
    await store.close()
    await store.open()
    try:
        assert await store.add_event(new_event("ev-1")) is False
        assert await store.add_event(new_event("ev-2")) is True
    finally:
        await store.close()
