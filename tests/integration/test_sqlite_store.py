"""What only the SQLite inbox promises: pragmas, group commit, migrations, and healing after
file-level faults (read-only files, another process holding the write lock)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest

from receiver.config.settings import StoreSettings
from receiver.errors import ConfigError, StoreUnavailable
from receiver.store import NewEvent, open_store
from receiver.store.memory import MemoryStore
from receiver.store.sqlite import SCHEMA_VERSION, SqliteStore, browse, intake, lanes, sqlite_path
from receiver.store.sqlite import schema as sqlite_schema

T0 = 1_700_000_000.0


def new_event(event_id: str, *, sinks: tuple[str, ...] = ("alpha",)) -> NewEvent:
    return NewEvent(
        id=event_id,
        event="job.completed",
        job_id="job-1",
        body=b'{"id": "%s"}' % event_id.encode(),
        headers={},
        received_at=T0,
        sinks=sinks,
    )


def settings_for(path: Path, **overrides: object) -> StoreSettings:
    return StoreSettings(url=f"sqlite:///{path}", **overrides)  # type: ignore[arg-type]


@asynccontextmanager
async def opened(path: Path, **kwargs: object) -> AsyncIterator[SqliteStore]:
    synchronous = str(kwargs.pop("synchronous", "full"))
    store = SqliteStore(settings_for(path, synchronous=synchronous), **kwargs)  # type: ignore[arg-type]
    await store.open()
    try:
        yield store
    finally:
        await store.close()


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


# -- schema -------------------------------------------------------------------------------------


async def test_migrates_an_empty_file_and_reopens_an_existing_one(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dirs" / "inbox.db"
    path.parent.mkdir(parents=True)
    path.touch()  # an empty file is a valid, empty SQLite database

    async with opened(path) as store:
        assert (await store.pragmas())["user_version"] == SCHEMA_VERSION
        await store.add_event(new_event("ev-1"))

    conn = sqlite3.connect(path)
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    finally:
        conn.close()
    assert {"events", "deliveries", "lanes", "events_enrich", "deliveries_due"} <= tables
    assert "events_state_received" in tables

    async with opened(path) as store:
        assert (await store.pragmas())["user_version"] == SCHEMA_VERSION
        assert await store.get("ev-1") is not None


async def test_creates_missing_parent_directories(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "inbox.db"
    async with opened(path):
        pass
    assert path.exists()


async def test_two_stores_migrating_one_new_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "inbox.db"
    first = SqliteStore(settings_for(path))
    second = SqliteStore(settings_for(path))
    try:
        await asyncio.gather(first.open(), second.open())
        assert await first.add_event(new_event("ev-1")) is True
        assert await second.add_event(new_event("ev-1")) is False
    finally:
        await first.close()
        await second.close()


async def test_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "inbox.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    store = SqliteStore(settings_for(path))
    with pytest.raises(StoreUnavailable, match="schema version 99"):
        await store.open()


async def test_without_auto_migrate_an_old_schema_is_refused(tmp_path: Path) -> None:
    store = SqliteStore(settings_for(tmp_path / "inbox.db", auto_migrate=False))
    with pytest.raises(StoreUnavailable, match="auto_migrate"):
        await store.open()


async def test_claim_and_prune_use_their_indexes(tmp_path: Path) -> None:
    path = tmp_path / "inbox.db"
    async with opened(path):
        pass
    conn = sqlite3.connect(path)
    try:
        claim = {"owner": "w", "expires": 1.0, "now": 1.0, "limit": 1}
        lane = {**claim, "sink": "alpha"}
        plans = {
            "enrich": conn.execute(
                "EXPLAIN QUERY PLAN " + lanes.SqliteLanes.CLAIM_ENRICHMENT, claim
            ).fetchall(),
            "claim": conn.execute(
                "EXPLAIN QUERY PLAN " + lanes.SqliteLanes.CLAIM_DELIVERIES, lane
            ).fetchall(),
            "prune": conn.execute(
                "EXPLAIN QUERY PLAN " + browse.SqliteBrowse.PRUNE_BATCH,
                {"older_than": 1.0, "limit": 10},
            ).fetchall(),
            "add": conn.execute(
                "EXPLAIN QUERY PLAN " + intake.SELECT_STORED, ('["a"]', '["k"]')
            ).fetchall(),
        }
    finally:
        conn.close()
    text = {name: " | ".join(row[3] for row in rows) for name, rows in plans.items()}
    assert "USING INDEX events_enrich (enrich_at<?)" in text["enrich"]
    assert "USING INDEX deliveries_due (sink=? AND next_attempt_at<?)" in text["claim"]
    assert "TEMP B-TREE" not in text["claim"] + text["enrich"]
    assert "events_state_received (state=? AND received_at<?)" in text["prune"]
    assert "SCAN events" not in text["add"]
    assert "SCAN job_outcomes" not in text["add"]


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


# -- urls ---------------------------------------------------------------------------------------


def test_sqlite_urls() -> None:
    assert sqlite_path("sqlite:///data/receiver.db") == Path("data/receiver.db")
    assert sqlite_path("sqlite:///receiver.db") == Path("receiver.db")
    assert sqlite_path("sqlite:////var/lib/receiver/inbox.db") == Path("/var/lib/receiver/inbox.db")
    for bad in ("sqlite://", "sqlite:///", "sqlite://host/x.db", "sqlite:///:memory:"):
        with pytest.raises(ConfigError, match=r"store\.url"):
            sqlite_path(bad)


async def test_open_store_relative_url_is_under_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store(StoreSettings(url="sqlite:///data/sub/receiver.db"))
    assert isinstance(store, SqliteStore)
    await store.open()
    try:
        await store.add_event(new_event("ev-1"))
    finally:
        await store.close()
    assert (tmp_path / "data" / "sub" / "receiver.db").exists()


async def test_open_store_absolute_url(tmp_path: Path) -> None:
    target = tmp_path / "abs" / "inbox.db"
    store = open_store(StoreSettings(url=f"sqlite:///{target}"))
    assert isinstance(store, SqliteStore)
    assert store.path == target
    await store.open()
    await store.close()
    assert target.exists()


def test_open_store_other_schemes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(open_store(StoreSettings(url="memory://")), MemoryStore)
    with pytest.raises(ConfigError, match=r"store\.url"):
        open_store(StoreSettings(url="mysql://localhost/db"))
    # Without the optional library, the error names the extra to install.
    monkeypatch.setitem(sys.modules, "receiver.store.postgres", None)
    for url in ("postgresql://localhost/db", "postgres://localhost/db"):
        with pytest.raises(ConfigError, match=r"pip install 'receiver\[postgres\]'"):
            open_store(StoreSettings(url=url))


# -- the lanes migration ------------------------------------------------------------------------

V1_EVENT = (
    "INSERT INTO events (id, event, job_id, body, headers, received_at, state, next_attempt_at, "
    "lease_owner, lease_expires_at) VALUES (?, 'job.completed', 'job-1', X'7B7D', '{}', ?, ?, ?, "
    "?, ?)"
)
V1_DELIVERY = (
    "INSERT INTO deliveries (event_id, sink, state, attempts, next_attempt_at, last_error, "
    "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


async def test_a_version_1_inbox_keeps_its_events_and_enriches_the_pending_ones(
    tmp_path: Path,
) -> None:
    path = tmp_path / "inbox.db"
    conn = sqlite3.connect(path)
    try:
        for statement in sqlite_schema.SCHEMA_V1:
            conn.execute(statement)
        conn.execute(V1_EVENT, ("ev-1", T0, "pending", T0 + 5, "old-worker", T0 + 60))
        conn.execute(V1_DELIVERY, ("ev-1", "alpha", "done", 1, None, None, T0))
        conn.execute(V1_DELIVERY, ("ev-1", "beta", "pending", 2, T0 + 5, "boom", T0))
        conn.execute(V1_EVENT, ("ev-2", T0, "done", None, None, None))
        conn.execute(V1_DELIVERY, ("ev-2", "alpha", "done", 1, None, None, T0))
        conn.commit()
    finally:
        conn.close()

    async with opened(path) as store:
        assert (await store.pragmas())["user_version"] == SCHEMA_VERSION
        # The old claim is gone with the old worker; the pending event is fetched afresh.
        records = await store.claim_enrichment(owner="w", limit=5, lease_seconds=60, now=T0 + 1)
        assert [r.id for r in records] == ["ev-1"]
        beta = records[0].deliveries[1]
        assert (beta.state, beta.attempts, beta.last_error) == ("pending", 2, "boom")
        done = await store.get("ev-2")
        assert done is not None and done.state == "done" and done.snapshot is None
