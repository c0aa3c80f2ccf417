"""``receiver backup`` and ``receiver restore`` on real files, each command as its own process:
what they write, what they refuse with one line, and that a refusal changes nothing."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from receiver.store import sqlite as sqlite_store
from receiver.store.sqlite import backup as backup_module
from receiver.store.sqlite.backup import back_up
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import write_config
from tests.support.old_inbox import (
    file_state,
    make_sqlite_inbox,
    set_sqlite_version,
    sqlite_rows,
    sqlite_version,
)

LATEST = sqlite_store.SCHEMA_VERSION
SUMMARY = re.compile(
    r"backup (?P<path>\S+): [\d.]+ (?:bytes|kB|MB|GB) \((?P<size>\d+) bytes\), "
    r"(?P<events>\d+) events, schema version (?P<version>\d+), [\d.]+ s"
)


def config_for(tmp_path: Path, db: Path) -> Path:
    return write_config(
        tmp_path / "config.toml",
        {"webhook": {"secrets": ["whsec_backup_files"]}, "store": {"url": f"sqlite:///{db}"}},
    )


def inbox(tmp_path: Path, events: int = 30) -> tuple[Path, Path, dict[str, list[tuple]]]:
    """An inbox at this release's schema with ``events`` events, its config, its rows."""
    db = tmp_path / "data" / "inbox.db"
    db.parent.mkdir(exist_ok=True)
    rows = make_sqlite_inbox(db, LATEST, events=events)
    return db, config_for(tmp_path, db), rows


def wrote(out: str) -> Path:
    match = SUMMARY.fullmatch(out.strip().splitlines()[0])
    assert match, out
    return Path(match["path"])


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".partial" in p.name)


# --- backup -----------------------------------------------------------------------------------


async def test_a_backup_is_a_checked_copy_with_every_row_and_a_summary_line(
    tmp_path: Path,
) -> None:
    _db, config, rows = inbox(tmp_path, events=60)
    dest = tmp_path / "backup.db"
    code, out, err = await run_cli("backup", "--config", str(config), str(dest))
    assert code == 0, err
    assert err == ""
    match = SUMMARY.fullmatch(out.strip())
    assert match, out
    assert Path(match["path"]) == dest
    assert int(match["size"]) == dest.stat().st_size
    assert (int(match["events"]), int(match["version"])) == (60, LATEST)
    assert sqlite_rows(dest) == {table: sorted(r) for table, r in rows.items()}
    with closing(sqlite3.connect(dest)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert leftovers(tmp_path) == []


async def test_an_existing_dest_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    _db, config, _rows = inbox(tmp_path)
    dest = tmp_path / "backup.db"
    dest.write_bytes(b"last week's backup")
    code, out, err = await run_cli("backup", "--config", str(config), str(dest))
    assert (code, out) == (1, "")
    assert_one_clean_line(err)
    assert "already exists" in err and str(dest) in err
    assert dest.read_bytes() == b"last week's backup"
    assert leftovers(tmp_path) == []


async def test_a_dest_under_a_regular_file_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    db, config, _rows = inbox(tmp_path)
    before = file_state(db)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where a directory was expected")
    for dest in (blocker / "backup.db", tmp_path / "missing" / "backup.db"):
        code, out, err = await run_cli("backup", "--config", str(config), str(dest))
        assert (code, out) == (1, ""), err
        assert_one_clean_line(err)
        assert f"cannot write {dest}" in err
    assert not (tmp_path / "missing").exists()
    assert file_state(db) == before


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
async def test_a_disk_full_midway_removes_the_partial_copy(tmp_path: Path) -> None:
    """A file size limit the copy cannot fit in stands for a full disk (the inbox is only
    read: its own files stay well under the limit)."""
    db, config, _rows = inbox(tmp_path, events=3000)
    limit = db.stat().st_size // 2
    assert limit > 64 * 1024, limit
    before = file_state(db)
    dest = tmp_path / "backups"
    dest.mkdir()
    code, stdout, stderr = await run_cli(
        "backup",
        "--config",
        str(config),
        str(dest),
        env={"PYTHONDONTWRITEBYTECODE": "1"},
        under=["prlimit", f"--fsize={limit}"],
    )
    assert (code, stdout) == (1, ""), stderr
    assert_one_clean_line(stderr)
    assert "the partial copy was removed, the inbox is as it was" in stderr
    assert list(dest.iterdir()) == []
    after = file_state(db)
    after.pop("inbox.db-writer", None)
    assert after == before


async def test_no_inbox_or_an_older_one_is_refused_a_newer_one_exits_2(
    tmp_path: Path,
) -> None:
    db = tmp_path / "inbox.db"
    config = config_for(tmp_path, db)
    code, out, err = await run_cli("backup", "--config", str(config), str(tmp_path / "b.db"))
    assert (code, out) == (1, "")
    assert_one_clean_line(err)
    assert f"there is no inbox at {db}: nothing to back up" in err
    assert not db.exists()
    make_sqlite_inbox(db, LATEST - 2)
    code, out, err = await run_cli("backup", "--config", str(config), str(tmp_path / "b.db"))
    assert (code, out) == (1, "")
    assert_one_clean_line(err)
    assert "run `receiver migrate` first (a backup never migrates)" in err
    assert sqlite_version(db) == LATEST - 2
    set_sqlite_version(db, LATEST + 1)
    code, out, err = await run_cli("backup", "--config", str(config), str(tmp_path / "b.db"))
    assert (code, out) == (2, "")
    assert_one_clean_line(err)
    assert f"schema version {LATEST + 1}, newer than this receiver knows" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml", "inbox.db"]


async def test_keep_rotates_the_copies_of_this_inbox_in_a_directory(tmp_path: Path) -> None:
    _db, config, _rows = inbox(tmp_path, events=5)
    backups = tmp_path / "backups"
    backups.mkdir()
    others = ["inbox-20200101T000000Z.db.partial", "other-20200101T000000Z.db", "notes.txt"]
    old = ["inbox-20200101T000000Z.db", "inbox-20200102T000000Z.db"]
    for name in others + old:
        (backups / name).write_text("not this run's")
    written = []
    for _ in range(3):
        code, out, err = await run_cli("backup", "--config", str(config), str(backups), "--keep=2")
        assert code == 0, err
        written.append(wrote(out))
        removed = out.strip().splitlines()[1:]
        assert all(line.startswith("removed the older backup ") for line in removed), out
    # Three copies within a few seconds: the same second gets -2, -3.
    assert all(re.fullmatch(r"inbox-\d{8}T\d{6}Z(-\d)?\.db", p.name) for p in written), written
    assert sorted(p.name for p in backups.iterdir()) == sorted(
        others + [p.name for p in written[1:]]
    )
    code, out, err = await run_cli("backup", "--config", str(config), str(backups), "--keep=0")
    assert code == 2 and "--keep" in err
    code, out, err = await run_cli(
        "backup", "--config", str(config), str(tmp_path / "x.db"), "--keep", "2"
    )
    assert code == 2
    assert_one_clean_line(err)
    assert "--keep needs DEST to be a directory" in err


async def test_progress_is_reported_at_most_once_a_second_and_ctrl_c_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process, with the reporting interval shortened: the sizes reported grow towards the
    inbox's size; an interrupt raised while the copy runs (as Ctrl-C in the main thread)
    stops it and removes the partial file."""
    db = tmp_path / "inbox.db"
    make_sqlite_inbox(db, LATEST, events=20_000)
    monkeypatch.setattr(backup_module, "PROGRESS_SECONDS", 0.001)
    seen: list[tuple[int, int]] = []
    done = back_up(db, tmp_path / "copy.db", progress=lambda n, total: seen.append((n, total)))
    assert seen, "no progress reported during a copy longer than the interval"
    sizes = [n for n, _total in seen]
    assert sizes == sorted(sizes)
    assert all(total == db.stat().st_size for _n, total in seen)
    assert done.events == 20_000

    def interrupt(_n: int, _total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        back_up(db, tmp_path / "again.db", progress=interrupt)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("again")) == []


# --- restore ----------------------------------------------------------------------------------


async def test_restore_moves_the_inbox_aside_and_puts_the_copy_in_place(tmp_path: Path) -> None:
    db, config, _rows = inbox(tmp_path, events=10)
    dest = tmp_path / "backup.db"
    code, _out, err = await run_cli("backup", "--config", str(config), str(dest))
    assert code == 0, err
    copy_rows = sqlite_rows(dest)
    backup_bytes = dest.read_bytes()
    with closing(sqlite3.connect(db)) as conn:  # the inbox moves on after the backup
        conn.execute("DELETE FROM deliveries")
        conn.commit()
    current = sqlite_rows(db)
    os.chmod(db, 0o640)
    owner = (4321, 4321) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    os.chown(db, *owner)  # as root: the receiver's user, not the one restoring

    code, out, err = await run_cli("restore", "--config", str(config), str(dest))
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].startswith(f"checked {dest}: a SQLite inbox at schema version {LATEST}, ")
    assert lines[1] == f"claimed {db}: no other process has it open; it stays locked until restored"
    aside = re.fullmatch(rf"moved the inbox {db} aside to (\S+) \(kept: .*\)", lines[2])
    assert aside, lines[2]
    assert lines[3] == f"put a copy of {dest} in place as {db} (synced to disk)"
    assert lines[4].startswith(f"released {db}: start the receiver")
    assert len(lines) == 5
    assert re.fullmatch(r"inbox\.db\.before-restore-\d{8}T\d{6}Z", Path(aside[1]).name)
    assert sqlite_rows(Path(aside[1])) == current  # the inbox as it was, kept
    assert sqlite_rows(db) == copy_rows
    assert dest.read_bytes() == backup_bytes  # the copy itself untouched
    restored = db.stat()
    assert (restored.st_uid, restored.st_gid, restored.st_mode & 0o777) == (*owner, 0o640)
    names = {p.name for p in db.parent.iterdir()} - {"inbox.db-writer"}  # the writers' turns
    assert names == {"inbox.db", Path(aside[1]).name}  # no -wal, -shm or temporary file left
    code, out, err = await run_cli("migrate", "status", "--config", str(config))
    assert code == 0, err


async def test_restore_clears_the_leases_of_the_processes_that_ran_when_the_copy_was_taken(
    tmp_path: Path,
) -> None:
    """Work in flight when the backup was taken is taken up at the next start, not after its
    lease expires: no process of the old receivers runs on the restored inbox."""
    db, config, _rows = inbox(tmp_path, events=10)
    with closing(sqlite3.connect(db)) as conn:
        conn.execute(
            "UPDATE deliveries SET lease_owner = 'gone-host:4242', lease_expires_at = 9e9 "
            "WHERE (event_id, sink) IN (SELECT event_id, sink FROM deliveries LIMIT 3)"
        )
        conn.commit()
        leased = conn.execute("SELECT count(*) FROM deliveries WHERE lease_owner IS NOT NULL")
        assert leased.fetchone() == (3,)
    dest = tmp_path / "backup.db"
    code, _out, err = await run_cli("backup", "--config", str(config), str(dest))
    assert code == 0, err
    code, out, err = await run_cli("restore", "--config", str(config), str(dest))
    assert code == 0, err
    assert "cleared 3 leases of the processes that ran when the copy was taken" in out
    with closing(sqlite3.connect(db)) as conn:
        held = conn.execute(
            "SELECT count(*) FROM deliveries WHERE lease_owner IS NOT NULL "
            "OR lease_expires_at IS NOT NULL"
        ).fetchone()
    assert held == (0,)
    with closing(sqlite3.connect(dest)) as conn:  # the backup itself keeps what it held
        kept = conn.execute("SELECT count(*) FROM deliveries WHERE lease_owner IS NOT NULL")
        assert kept.fetchone() == (3,)


def not_sqlite(path: Path) -> None:
    path.write_text("[store]\nurl = 'sqlite:///data/inbox.db'\n")


def truncated_to_half(path: Path) -> None:
    make_sqlite_inbox(path, LATEST, events=3000)
    os.truncate(path, path.stat().st_size // 2)


def newer(path: Path) -> None:
    make_sqlite_inbox(path, LATEST, events=3)
    set_sqlite_version(path, LATEST + 1)


BAD_COPIES = {
    "not a SQLite file": (not_sqlite, 1, "is not a SQLite database"),
    "truncated to half": (truncated_to_half, 1, "is damaged"),
    "a newer schema": (newer, 2, f"has schema version {LATEST + 1}, newer than this receiver"),
}


@pytest.mark.parametrize("bad", list(BAD_COPIES))
async def test_a_bad_copy_is_refused_with_one_line_and_nothing_changes(
    tmp_path: Path, bad: str
) -> None:
    db, config, _rows = inbox(tmp_path)
    make, exit_code, said = BAD_COPIES[bad]
    src = tmp_path / "copy.db"
    make(src)
    before, src_before = file_state(db), file_state(src)
    code, out, err = await run_cli("restore", "--config", str(config), str(src))
    assert (code, out) == (exit_code, ""), err
    assert_one_clean_line(err)
    assert said in err
    if exit_code == 1:
        assert "nothing was changed" in err
    assert file_state(db) == before
    assert file_state(src) == src_before


async def test_an_older_copy_is_restored_and_migrated_later_with_a_copy_kept(
    tmp_path: Path,
) -> None:
    db, config, _rows = inbox(tmp_path)
    src = tmp_path / "old.db"
    old_rows = make_sqlite_inbox(src, LATEST - 3, events=12)
    code, out, err = await run_cli("restore", "--config", str(config), str(src))
    assert code == 0, err
    assert (
        f"its schema version {LATEST - 3} is older than this release's {LATEST}: it is "
        "migrated at the next start" in out
    )
    assert sqlite_version(db) == LATEST - 3
    code, out, err = await run_cli("migrate", "--config", str(config))
    assert code == 0, err
    assert f"migrated from version {LATEST - 3} to {LATEST}" in out
    assert "before-migrate" in out
    assert sqlite_rows(db) == {table: sorted(r) for table, r in old_rows.items()}


async def test_stale_wal_and_shm_of_a_missing_inbox_are_moved_aside_never_deleted(
    tmp_path: Path,
) -> None:
    db = tmp_path / "data" / "inbox.db"
    db.parent.mkdir()
    config = config_for(tmp_path, db)
    (db.parent / "inbox.db-wal").write_bytes(b"stale wal")
    (db.parent / "inbox.db-shm").write_bytes(b"stale shm")
    src = tmp_path / "copy.db"
    rows = make_sqlite_inbox(src, LATEST, events=4)
    code, out, err = await run_cli("restore", "--config", str(config), str(src))
    assert code == 0, err
    assert f"no inbox at {db} yet: nothing to move aside" in out
    names = sorted(p.name for p in db.parent.iterdir())
    assert names[0] == "inbox.db" and len(names) == 3, names
    for suffix, content in (("-wal", b"stale wal"), ("-shm", b"stale shm")):
        (kept,) = [n for n in names if n.endswith(suffix)]
        assert re.fullmatch(rf"inbox\.db\.before-restore-\d{{8}}T\d{{6}}Z{suffix}", kept)
        assert (db.parent / kept).read_bytes() == content
    assert sqlite_rows(db) == {table: sorted(r) for table, r in rows.items()}


async def test_a_damaged_inbox_is_moved_aside_as_it_is(tmp_path: Path) -> None:
    db, config, _rows = inbox(tmp_path)
    db.write_bytes(b"\0" * 100 + b"what a broken disk left")
    src = tmp_path / "copy.db"
    rows = make_sqlite_inbox(src, LATEST, events=4)
    code, out, err = await run_cli("restore", "--config", str(config), str(src))
    assert code == 0, err
    assert f"the inbox {db} is damaged" in out
    (aside,) = db.parent.glob("inbox.db.before-restore-*")
    assert aside.read_bytes() == b"\0" * 100 + b"what a broken disk left"
    assert sqlite_rows(db) == {table: sorted(r) for table, r in rows.items()}
