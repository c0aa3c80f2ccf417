"""Before migrating a SQLite inbox that holds data, the receiver writes a copy of it beside it
(``<inbox>.before-migrate-v<from>-<UTC time>``), names it in ``receiver migrate``'s report and in
its log, and keeps the newest three; when the copy cannot be written, nothing is migrated."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from receiver.store import sqlite
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import write_config
from tests.support.old_inbox import (
    file_state,
    make_sqlite_inbox,
    sqlite_rows,
    sqlite_tables,
    sqlite_version,
)

LATEST = sqlite.SCHEMA_VERSION
KEPT_AT = "the inbox as it was before is kept at "


def config_for(tmp_path: Path, db: Path) -> Path:
    return write_config(
        tmp_path / "config.toml",
        {"webhook": {"secrets": ["whsec_migrate_backup"]}, "store": {"url": f"sqlite:///{db}"}},
    )


def copies_of(db: Path) -> list[str]:
    return sorted(p.name for p in db.parent.glob(f"{db.name}.before-*"))


async def test_migrating_an_old_inbox_keeps_a_copy_of_it_as_it_was(tmp_path: Path) -> None:
    db = tmp_path / "data" / "inbox.db"
    db.parent.mkdir()
    rows = make_sqlite_inbox(db, 3, events=30)
    tables = sqlite_tables(db)
    config = config_for(tmp_path, db)

    code, out, err = await run_cli("migrate", "--config", str(config), cwd=tmp_path)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0] == (
        f"inbox sqlite:///{db}: migrated from version 3 to {LATEST} (applied "
        + ", ".join(str(v) for v in range(4, LATEST + 1))
        + ")"
    )
    assert lines[1].startswith(KEPT_AT) and len(lines) == 2
    copy = Path(lines[1].removeprefix(KEPT_AT))
    assert copy.parent == db.parent
    assert re.fullmatch(r"inbox\.db\.before-migrate-v3-\d{8}T\d{6}Z", copy.name), copy.name

    # The copy is the inbox as it was: its version, its tables, every row.
    assert sqlite_version(copy) == 3
    assert sqlite_tables(copy) == tables
    assert sqlite_rows(copy) == {table: sorted(r) for table, r in rows.items()}
    # And the inbox, migrated, still holds every row.
    assert sqlite_version(db) == LATEST
    assert sqlite_rows(db) == sqlite_rows(copy)

    logged = [json.loads(line) for line in err.strip().splitlines()]
    migrated = [entry for entry in logged if entry["event"] == "inbox schema migrated"]
    assert len(migrated) == 1
    assert migrated[0]["backup"] == str(copy)
    assert (migrated[0]["before"], migrated[0]["after"]) == (3, LATEST)


async def test_a_new_inbox_and_an_inbox_up_to_date_get_no_copy(tmp_path: Path) -> None:
    db = tmp_path / "inbox.db"
    config = config_for(tmp_path, db)
    for expected in ("migrated from version 0", "already at version"):
        code, out, err = await run_cli("migrate", "--config", str(config), cwd=tmp_path)
        assert code == 0, err
        assert expected in out and KEPT_AT not in out
    assert copies_of(db) == []


async def test_the_newest_three_copies_are_kept(tmp_path: Path) -> None:
    db = tmp_path / "inbox.db"
    make_sqlite_inbox(db, 5)
    # Copies left by earlier upgrades (older times), and one of another kind.
    old = [f"inbox.db.before-migrate-v{v}-2020010{v}T000000Z" for v in (1, 2, 3, 4)]
    old.append("inbox.db.before-migrate-v4-20200104T000000Z-2")  # the same second, again
    for name in [*old, "inbox.db.before-reindex-20190101T000000Z"]:
        (tmp_path / name).write_bytes(b"an earlier copy")

    code, out, err = await run_cli("migrate", "--config", str(config_for(tmp_path, db)))
    assert code == 0, err
    new = Path(out.strip().splitlines()[1].removeprefix(KEPT_AT)).name
    assert copies_of(db) == sorted(
        [
            "inbox.db.before-migrate-v4-20200104T000000Z",
            "inbox.db.before-migrate-v4-20200104T000000Z-2",
            new,
            "inbox.db.before-reindex-20190101T000000Z",  # not a migration's: left alone
        ]
    )
    removed = next(
        json.loads(line) for line in err.splitlines() if "inbox schema migrated" in line
    )["older_copies_removed"]
    assert sorted(Path(p).name for p in removed) == old[:3]


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
async def test_when_the_copy_cannot_be_written_nothing_is_migrated(tmp_path: Path) -> None:
    """A file size limit the copy cannot fit in stands for a full disk: one line, the inbox as
    it was, no part of a copy left; once there is room, the same command migrates."""
    db = tmp_path / "inbox.db"
    rows = make_sqlite_inbox(db, 3, events=3000)
    size = db.stat().st_size
    limit = size // 2
    assert limit > 64 * 1024, size  # room for SQLite's own -shm and -wal, not for the copy
    before = file_state(db)
    config = config_for(tmp_path, db)

    code, stdout, stderr = await run_cli(
        "migrate",
        "--config",
        str(config),
        env={"PYTHONDONTWRITEBYTECODE": "1"},
        under=["prlimit", f"--fsize={limit}"],
    )
    assert code == 1, stderr
    assert stdout == ""
    assert_one_clean_line(stderr)
    line = stderr.strip()
    assert line.startswith(
        f"receiver: the inbox {db} was not migrated: the copy of it to keep first could not be "
        "written beside it ("
    ), line
    assert line.endswith(
        "nothing was changed: make room or make its directory writable and try again"
    )
    after = file_state(db)
    after.pop("inbox.db-writer", None)  # the writers' turn file, empty
    assert after == before  # the same bytes, no -wal or part of a copy left
    assert sqlite_version(db) == 3

    code, out, err = await run_cli("migrate", "--config", str(config))
    assert code == 0, err
    assert "migrated from version 3" in out
    assert sqlite_version(db) == LATEST
    assert sqlite_rows(db) == {table: sorted(r) for table, r in rows.items()}
    assert len([c for c in copies_of(db) if "before-migrate-v3" in c]) == 1
