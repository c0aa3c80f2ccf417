"""``receiver migrate status`` and ``receiver migrate --dry-run``: where an inbox's schema stands
and what would run, read without changing anything, on SQLite and Postgres; and an inbox a newer
release wrote, refused by every command that opens it (exit 2, one line naming both versions)
and left as it was. Each command runs as its own process, as a user runs it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from receiver import __version__
from receiver.store import postgres, sqlite
from receiver.store.sql.versions import DESCRIPTIONS
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import free_port, write_config
from tests.support.old_inbox import (
    connect_to,
    file_state,
    make_postgres_inbox,
    make_sqlite_inbox,
    postgres_rows,
    postgres_state,
    set_sqlite_version,
    sqlite_version,
)
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres

LATEST = sqlite.SCHEMA_VERSION
RELEASE_LINE = f"this release: {__version__}, schema version {LATEST}"


def config_for(tmp_path: Path, **store: Any) -> Path:
    return write_config(
        tmp_path / "config.toml",
        {
            "server": {"port": free_port()},
            "admin": {"port": free_port()},
            "webhook": {"secrets": ["whsec_migrate_status"]},
            "store": store,
        },
    )


def listed(out: str) -> list[int]:
    """The migrations a report lists (``  N  description``), checking each description."""
    found = []
    for line in out.splitlines():
        match = re.fullmatch(r"  (\d+)  (.+)", line)
        if match:
            version = int(match[1])
            assert match[2] == DESCRIPTIONS[version], line
            found.append(version)
    return found


async def migrate(config: Path, *args: str, cwd: Path) -> tuple[int | None, str, str]:
    return await run_cli("migrate", *args, "--config", str(config), cwd=cwd)


# -- SQLite -------------------------------------------------------------------------------------


async def test_a_sqlite_inbox_not_made_yet_is_at_version_0_and_reading_it_creates_nothing(
    tmp_path: Path,
) -> None:
    config = config_for(tmp_path, url="sqlite:///data/inbox.db")

    code, out, err = await migrate(config, "status", cwd=tmp_path)
    assert code == 1, err
    assert "schema version: 0 (no file yet: `receiver migrate` creates it)" in out
    assert RELEASE_LINE in out
    assert f"pending: {LATEST} migrations" in out
    assert listed(out) == list(range(1, LATEST + 1))

    code, out, err = await migrate(config, "--dry-run", cwd=tmp_path)
    assert code == 0, err
    assert listed(out) == list(range(1, LATEST + 1))
    assert "copy" not in out  # a new inbox has nothing to keep
    assert "nothing was changed (--dry-run)" in out
    assert not (tmp_path / "data").exists()


async def test_status_and_dry_run_of_an_old_sqlite_inbox_list_what_is_pending_and_change_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "inbox.db"
    make_sqlite_inbox(db, 3)
    before = file_state(db)
    config = config_for(tmp_path, url=f"sqlite:///{db}")

    code, out, err = await migrate(config, "status", cwd=tmp_path)
    assert code == 1, err
    assert out.splitlines()[:3] == [f"inbox: sqlite:///{db}", "schema version: 3", RELEASE_LINE]
    assert listed(out) == list(range(4, LATEST + 1))
    assert "run `receiver migrate` to apply them" in out

    code, out, err = await migrate(config, "--dry-run", cwd=tmp_path)
    assert code == 0, err
    assert f"would apply {LATEST - 3} migrations, in one transaction:" in out
    assert listed(out) == list(range(4, LATEST + 1))
    assert f"would first write a copy of the inbox to {db}.before-migrate-v3-<UTC time>" in out
    assert file_state(db) == before  # the file's bytes, and no -wal, -shm or copy left

    code, out, err = await migrate(config, cwd=tmp_path)
    assert code == 0, err
    code, out, err = await migrate(config, "status", cwd=tmp_path)
    assert code == 0, err
    assert f"schema version: {LATEST}" in out and "pending: none, up to date" in out
    assert listed(out) == []
    code, out, err = await migrate(config, "--dry-run", cwd=tmp_path)
    assert (code, listed(out)) == (0, [])
    assert "nothing to apply" in out


async def test_status_reads_the_config_named_before_or_after_it(tmp_path: Path) -> None:
    db = tmp_path / "inbox.db"
    make_sqlite_inbox(db, 6)
    config = config_for(tmp_path, url=f"sqlite:///{db}")
    after = await run_cli("migrate", "status", "--config", str(config), cwd=tmp_path)
    before = await run_cli("migrate", "--config", str(config), "status", cwd=tmp_path)
    assert after == before
    assert after[0] == 1 and listed(after[1]) == list(range(7, LATEST + 1))


async def test_status_with_dry_run_and_an_unknown_action_are_one_line_mistakes(
    tmp_path: Path,
) -> None:
    config = config_for(tmp_path, url="sqlite:///data/inbox.db")
    code, out, err = await migrate(config, "status", "--dry-run", cwd=tmp_path)
    assert (code, out) == (2, "")
    assert_one_clean_line(err)
    assert "--dry-run" in err
    code, out, err = await migrate(config, "stauts", cwd=tmp_path)
    assert (code, out) == (2, "")
    assert_one_clean_line(err)
    assert "did you mean status?" in err
    assert not (tmp_path / "data").exists()


async def test_a_memory_inbox_has_nothing_to_migrate(tmp_path: Path) -> None:
    config = config_for(tmp_path, url="memory://")
    for args in (("status",), ("--dry-run",), ()):
        code, out, err = await migrate(config, *args, cwd=tmp_path)
        assert code == 0, err
        assert out.strip() == "inbox memory://: kept in memory, nothing to migrate"


OPENERS = [
    ("migrate", "--dry-run"),
    ("migrate",),
    ("serve",),
    ("events", "list"),
]


@pytest.mark.parametrize("command", OPENERS, ids=" ".join)
async def test_a_sqlite_inbox_a_newer_release_wrote_is_refused_and_left_as_it_was(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    db = tmp_path / "inbox.db"
    make_sqlite_inbox(db, LATEST)
    set_sqlite_version(db, LATEST + 1)
    before = file_state(db)
    assert list(before) == ["inbox.db"]
    config = config_for(tmp_path, url=f"sqlite:///{db}")

    code, out, err = await run_cli(*command, "--config", str(config), cwd=tmp_path)
    assert (code, out) == (2, ""), err
    assert_one_clean_line(err)
    assert len(err.strip().splitlines()) == 1
    assert err.strip() == (
        f"receiver: the inbox {db} has schema version {LATEST + 1}, newer than this receiver "
        f"knows: a newer release wrote it, and this one ({__version__}) knows up to version "
        f"{LATEST}; upgrade the receiver or restore a backup taken before that upgrade"
    )
    assert file_state(db) == before  # same bytes; no -wal, -shm or turn file left behind
    assert sqlite_version(db) == LATEST + 1


async def test_status_of_a_sqlite_inbox_a_newer_release_wrote_exits_2(tmp_path: Path) -> None:
    db = tmp_path / "inbox.db"
    make_sqlite_inbox(db, LATEST)
    set_sqlite_version(db, LATEST + 1)
    before = file_state(db)
    code, out, err = await migrate(
        config_for(tmp_path, url=f"sqlite:///{db}"), "status", cwd=tmp_path
    )
    assert (code, err) == (2, "")
    assert f"schema version: {LATEST + 1}" in out and RELEASE_LINE in out
    assert "a newer release wrote this inbox" in out and listed(out) == []
    assert file_state(db) == before


# -- Postgres -----------------------------------------------------------------------------------


async def test_status_and_dry_run_of_an_old_postgres_inbox_list_what_is_pending_and_write_nothing(
    tmp_path: Path,
) -> None:
    require_postgres()
    async with fresh_schema() as schema:
        config = config_for(tmp_path, url=POSTGRES_URL, schema=schema)
        code, out, err = await migrate(config, "status", cwd=tmp_path)
        assert code == 1, err
        assert "schema version: 0" in out and f"(schema {schema})" in out
        assert listed(out) == list(range(1, LATEST + 1))
        assert (await postgres_state(schema))["exists"] is False  # not even the schema

        await make_postgres_inbox(schema, 5)
        before = await postgres_state(schema)
        code, out, err = await migrate(config, "status", cwd=tmp_path)
        assert code == 1, err
        assert "schema version: 5" in out and listed(out) == list(range(6, LATEST + 1))
        code, out, err = await migrate(config, "--dry-run", cwd=tmp_path)
        assert code == 0, err
        assert listed(out) == list(range(6, LATEST + 1)) and "copy" not in out
        assert await postgres_state(schema) == before

        code, out, err = await migrate(config, cwd=tmp_path)
        assert code == 0, err
        applied = ", ".join(str(v) for v in range(6, LATEST + 1))
        assert f"migrated from version 5 to {LATEST} (applied {applied})" in out
        code, out, err = await migrate(config, "status", cwd=tmp_path)
        assert code == 0, err
        assert "pending: none, up to date" in out


@pytest.mark.parametrize("command", [("migrate", "status"), *OPENERS], ids=" ".join)
async def test_a_postgres_schema_a_newer_release_wrote_is_refused_and_left_as_it_was(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    require_postgres()
    async with fresh_schema() as schema:
        rows = await make_postgres_inbox(schema, postgres.SCHEMA_VERSION)
        conn = await connect_to(schema)
        try:
            await conn.execute(
                "INSERT INTO receiver_schema_migrations (version, description) "
                "VALUES (99, 'from a later release')"
            )
        finally:
            await conn.close()
        before = await postgres_state(schema)
        config = config_for(tmp_path, url=POSTGRES_URL, schema=schema)

        code, out, err = await run_cli(*command, "--config", str(config), cwd=tmp_path)
        assert code == 2, err
        if command == ("migrate", "status"):
            assert err == "" and "schema version: 99" in out
        else:
            assert_one_clean_line(err)
            assert len(err.strip().splitlines()) == 1
            assert f"(schema {schema}) has schema version 99, newer than this receiver" in err
            assert f"this one ({__version__}) knows up to version {LATEST}" in err
        assert await postgres_state(schema) == before
        assert await postgres_rows(schema) == {table: sorted(r) for table, r in rows.items()}
