"""The SQLite inbox's check at start (:mod:`receiver.store.sqlite.health`), on real files damaged
the ways :mod:`tests.support.damage` describes: wrong indexes are rebuilt after a copy of the
file is kept, anything worse stops the start with one line and leaves the file as it was, a
healthy file starts without a word, a check past its time limit says so and the start goes on,
and only ``receiver serve`` checks (never a command)."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from receiver.config.settings import StoreSettings
from receiver.errors import StoreDamaged
from receiver.store import NewEvent, open_store
from receiver.store.sqlite import SqliteStore, health
from tests.support import damage
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import ReceiverProcess, free_port, write_config

EVENTS = 300
SECRET = "whsec_health_" + "4e" * 12
# Hidden from both while some events move by half a second: both miss those rows (a few, or
# every one: more problems than the check lists).
DAMAGED = ["events_received", "events_state_received"]
SHIFT = ["UPDATE events SET received_at = received_at + 0.5 WHERE rowid % 50 = 0"]
EVERY_ROW = ["UPDATE events SET received_at = received_at + 0.5"]


def new_event(n: int) -> NewEvent:
    return NewEvent(
        id=f"evt-{n:04d}",
        event="job.completed",
        job_id=f"job-{n}",
        body=b'{"id": "evt-%04d"}' % n,
        headers={},
        received_at=time.time() - 1000 + n,
        sinks=("files",),
    )


def settings_for(db: Path) -> StoreSettings:
    return StoreSettings(url=f"sqlite:///{db}")


@asynccontextmanager
async def opened(db: Path, *, check: bool = True) -> AsyncIterator[SqliteStore]:
    store = SqliteStore(settings_for(db), check=check)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def build(db: Path, count: int = EVENTS) -> list[str]:
    """An inbox of ``count`` pending events, written by the receiver's own store; their ids."""
    async with opened(db, check=False) as store:
        for n in range(count):
            assert await store.add_event(new_event(n))
    return stored_ids(db)


def stored_ids(db: Path) -> list[str]:
    """Every event id in the table itself (``NOT INDEXED``: whatever the indexes say)."""
    with closing(sqlite3.connect(db)) as conn:
        return [row[0] for row in conn.execute("SELECT id FROM events NOT INDEXED ORDER BY id")]


def digest(db: Path) -> str:
    """The file's bytes (read only between two opens, by this test process)."""
    return hashlib.sha256(db.read_bytes()).hexdigest()


def backups(db: Path) -> list[Path]:
    return sorted(db.parent.glob(f"{db.name}.before-reindex-*"))


def health_logs(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e.get("logger_name") == "receiver.store.sqlite.health"]


# -- in the process: the store opened with the check ---------------------------------------------


async def test_a_healthy_inbox_starts_without_a_word_or_a_copy(tmp_path: Path) -> None:
    db = tmp_path / "inbox.db"
    ids = await build(db)
    with capture_logs() as logs:
        async with opened(db) as store:
            assert len(await store.list(state="pending", limit=1000)) == EVENTS
    assert logs == []
    assert backups(db) == []
    assert stored_ids(db) == ids


async def test_a_new_inbox_is_checked_and_created(tmp_path: Path) -> None:
    db = tmp_path / "data" / "inbox.db"
    with capture_logs() as logs:
        async with opened(db) as store:
            assert await store.add_event(new_event(1))
    assert logs == [] and backups(db) == []


async def test_wrong_indexes_are_rebuilt_after_a_copy_is_kept(tmp_path: Path) -> None:
    db = tmp_path / "inbox.db"
    ids = await build(db)
    damage.change_behind_index(db, DAMAGED, SHIFT)
    found = damage.integrity(db)
    assert any("missing from index events_state_received" in p for p in found), found
    with capture_logs() as logs:
        async with opened(db) as store:
            pending = await store.list(state="pending", limit=1000)
            assert sorted(e.id for e in pending) == ids  # the indexes' answers are whole again
            assert await store.add_event(new_event(EVENTS))
    [line] = health_logs(logs)
    assert line["log_level"] == "warning"
    assert sorted(line["indexes"]) == DAMAGED
    assert line["check"] == "complete" and line["check_after"] == "ok"
    assert line["rebuilt"] == "these indexes"
    [backup] = backups(db)
    assert line["backup"] == str(backup)
    assert damage.integrity(db) == ["ok"]
    assert stored_ids(db) == sorted([*ids, new_event(EVENTS).id])  # no event lost
    # The copy is the file as it was: the same rows, the same damage.
    assert stored_ids(backup) == ids
    assert damage.integrity(backup) == found


async def test_a_damaged_table_stops_the_start_and_leaves_the_file(tmp_path: Path) -> None:
    db = tmp_path / "inbox.db"
    await build(db)
    damage.null_where_forbidden(db, "evt-0007")
    assert damage.integrity(db) == ["NULL value in events.job_id"]
    before = digest(db)
    with capture_logs() as logs, pytest.raises(StoreDamaged) as raised:
        async with opened(db):
            pass
    message = raised.value.message
    assert "NULL value in events.job_id" in message and health.DOCS in message
    assert "\n" not in message
    assert logs == [] and backups(db) == []
    assert digest(db) == before


@pytest.mark.parametrize("leaf", [False, True], ids=["root page", "leaf page"])
async def test_a_malformed_file_stops_the_start_and_leaves_the_file(
    tmp_path: Path, leaf: bool
) -> None:
    db = tmp_path / "inbox.db"
    await build(db)
    damage.break_table(db, "events", leaf=leaf)
    before = digest(db)
    with pytest.raises(StoreDamaged) as raised:
        async with opened(db):
            pass
    assert "malformed" in raised.value.message and health.DOCS in raised.value.message
    assert backups(db) == [] and digest(db) == before


async def test_a_rebuild_that_fails_stops_the_start_and_leaves_the_file(tmp_path: Path) -> None:
    """Two rows with one event id: only the key's index looks wrong, but REINDEX cannot build a
    unique index over them. The copy was written first; the file is left as it was. The way
    out docs/operations.md gives (delete one of the two) then lets the receiver start."""
    db = tmp_path / "inbox.db"
    await build(db)
    damage.duplicate_event(db, "evt-0007")
    before = digest(db)
    with pytest.raises(StoreDamaged) as raised:
        async with opened(db):
            pass
    message = raised.value.message
    assert "UNIQUE constraint failed: events.id" in message and health.DOCS in message
    [backup] = backups(db)
    assert str(backup) in message
    assert digest(db) == before
    assert stored_ids(backup) == stored_ids(db)
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        rowids = [r for (r,) in conn.execute("SELECT rowid FROM events WHERE id = 'evt-0007'")]
        conn.execute("DELETE FROM events WHERE rowid = ?", rowids[:1])  # the indexed one
    with capture_logs() as logs:
        async with opened(db) as store:
            assert (await store.get("evt-0007")) is not None
    assert [e["indexes"] for e in health_logs(logs)] == [["sqlite_autoindex_events_1"]]
    assert damage.integrity(db) == ["ok"] and len(stored_ids(db)) == EVENTS


async def test_a_check_past_its_time_says_it_is_incomplete_and_the_start_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "inbox.db"
    await build(db)
    monkeypatch.setattr(health, "CHECK_SECONDS", 0.0)
    monkeypatch.setattr(health, "PROGRESS_STEPS", 10)
    with capture_logs() as logs:
        async with opened(db) as store:
            assert await store.add_event(new_event(EVENTS))
    [line] = health_logs(logs)
    assert line["log_level"] == "warning"
    assert "cut short" in line["event"] and "incomplete" in line["event"]
    assert backups(db) == []


async def test_past_the_checks_problem_limit_every_index_is_rebuilt(tmp_path: Path) -> None:
    """The check stops at its first 100 problems, which may not name every damaged index: then
    every index is rebuilt, not only those it named."""
    db = tmp_path / "inbox.db"
    ids = await build(db)
    damage.change_behind_index(db, DAMAGED, EVERY_ROW)
    assert len(damage.integrity(db)) == health.MAX_PROBLEMS
    with capture_logs() as logs:
        async with opened(db) as store:
            assert len(await store.list(state="pending", limit=1000)) == EVENTS
    [line] = health_logs(logs)
    assert line["rebuilt"] == "every index"
    assert line["check"] == f"stopped at its first {health.MAX_PROBLEMS} problems"
    assert damage.integrity(db) == ["ok"] and stored_ids(db) == ids


async def test_commands_never_check_nor_repair(tmp_path: Path) -> None:
    """``receiver events list`` (any command: open_store without check) opens a damaged inbox
    as it is: no check, no copy, no REINDEX."""
    db = tmp_path / "inbox.db"
    await build(db)
    damage.change_behind_index(db, DAMAGED, SHIFT)
    found = damage.integrity(db)
    store = open_store(settings_for(db))
    assert isinstance(store, SqliteStore) and not store.check
    config = write_config(
        tmp_path / "config.toml",
        {"webhook": {"secrets": [SECRET]}, "store": {"url": "sqlite:///inbox.db"}},
    )
    code, _, err = await run_cli("events", "list", "--config", str(config), cwd=tmp_path)
    assert code == 0, err
    assert backups(db) == [] and damage.integrity(db) == found


# -- receiver serve ------------------------------------------------------------------------------


def serve_config(tmp_path: Path) -> Path:
    return write_config(
        tmp_path / "config.toml",
        {
            "server": {"host": "127.0.0.1", "port": free_port()},
            "admin": {"port": free_port()},
            "webhook": {"secrets": [SECRET]},
            "store": {"url": "sqlite:///inbox.db"},
            "log": {"format": "json", "level": "info"},
        },
    )


async def served_once(tmp_path: Path) -> ReceiverProcess:
    """``receiver serve`` started on the inbox under ``tmp_path``, ready, then stopped (exit 0)."""
    receiver = ReceiverProcess(serve_config(tmp_path), role="intake")
    receiver.start()
    try:
        await receiver.wait_ready()
        assert receiver.terminate() == 0
    finally:
        receiver.stop()
    return receiver


async def test_serve_rebuilds_wrong_indexes_with_one_warning(tmp_path: Path) -> None:
    db = tmp_path / "inbox.db"
    ids = await build(db)
    damage.change_behind_index(db, DAMAGED, SHIFT)
    receiver = await served_once(tmp_path)
    lines = [line for line in receiver.log().splitlines() if "store.sqlite.health" in line]
    assert len(lines) == 1, receiver.log()
    assert '"level": "warning"' in lines[0] and "events_state_received" in lines[0]
    [backup] = backups(db)
    assert str(backup) in lines[0]
    assert damage.integrity(db) == ["ok"] and stored_ids(db) == ids
    assert stored_ids(backup) == ids


async def test_serve_on_a_healthy_inbox_says_nothing_of_it(tmp_path: Path) -> None:
    db = tmp_path / "inbox.db"
    await build(db)
    receiver = await served_once(tmp_path)
    log = receiver.log()
    assert "store.sqlite.health" not in log and '"level": "warning"' not in log, log
    assert backups(db) == []


async def test_serve_refuses_a_damaged_table_with_one_line(tmp_path: Path) -> None:
    db = tmp_path / "inbox.db"
    await build(db)
    damage.break_table(db, "events", leaf=True)
    before = digest(db)
    config = serve_config(tmp_path)
    code, _, err = await run_cli("serve", "--config", str(config), cwd=tmp_path)
    assert code == 1
    assert_one_clean_line(err)
    assert len(err.strip().splitlines()) == 1, err
    assert health.DOCS in err and "the inbox database inbox.db is damaged" in err
    assert digest(db) == before and backups(db) == []
