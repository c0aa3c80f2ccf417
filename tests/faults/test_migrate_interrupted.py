"""A migration killed half way, on SQLite and on Postgres: every pending migration runs in one
transaction, so the inbox keeps the version it had, a receiver of this release does not start on
it without migrating, and running ``receiver migrate`` again migrates it with every row kept.

Half way is made certain two ways: the crash point ``mid_migration`` of ``RECEIVER_FAULT_INJECT``
(the process exits by itself, as a SIGKILL would end it, after a given number of migrations ran
in the transaction); and, on Postgres, a real SIGKILL while the migration waits for a lock another
connection holds on a table a later migration alters (the earlier ones ran).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from receiver.faults import ENV_VAR, EXIT_CODE
from receiver.store import postgres, sqlite
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import ROOT, free_port, wait_for, write_config
from tests.support.old_inbox import (
    connect_to,
    make_postgres_inbox,
    make_sqlite_inbox,
    postgres_rows,
    postgres_state,
    postgres_version,
    sqlite_rows,
    sqlite_tables,
    sqlite_version,
)
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres

FROM = 2
LATEST = sqlite.SCHEMA_VERSION
assert postgres.SCHEMA_VERSION == LATEST
APPLIED = ", ".join(str(v) for v in range(FROM + 1, LATEST + 1))


def config_for(tmp_path: Path, name: str, **store: Any) -> Path:
    return write_config(
        tmp_path / name,
        {
            "server": {"port": free_port()},
            "admin": {"port": free_port()},
            "webhook": {"secrets": ["whsec_migrate_interrupted"]},
            "store": store,
        },
    )


class Inbox:
    """One old inbox, SQLite or Postgres: its config, its version, rows and tables now."""

    def __init__(self, tmp_path: Path, backend: str, schema: str) -> None:
        self.backend = backend
        self.schema = schema
        self.db = tmp_path / "inbox.db"
        if backend == "sqlite":
            store: dict[str, Any] = {"url": f"sqlite:///{self.db}"}
        else:
            store = {"url": POSTGRES_URL, "schema": schema}
        self.config = config_for(tmp_path, "config.toml", **store)
        self.manual = config_for(tmp_path, "manual.toml", **store, auto_migrate=False)

    async def make(self, version: int, events: int) -> None:
        if self.backend == "sqlite":
            make_sqlite_inbox(self.db, version, events=events)
        else:
            await make_postgres_inbox(self.schema, version, events=events)

    async def version(self) -> int:
        if self.backend == "sqlite":
            return sqlite_version(self.db)
        return await postgres_version(self.schema)

    async def rows(self) -> Any:
        if self.backend == "sqlite":
            return sqlite_rows(self.db)
        return await postgres_rows(self.schema)

    async def shape(self) -> Any:
        """Its tables (and, on Postgres, columns, indexes and migrations recorded)."""
        if self.backend == "sqlite":
            return sqlite_tables(self.db)
        return await postgres_state(self.schema)


@asynccontextmanager
async def schema_for(backend: str) -> AsyncIterator[str]:
    """A fresh Postgres schema (dropped at exit), or nothing for SQLite."""
    if backend == "sqlite":
        yield ""
        return
    require_postgres()
    async with fresh_schema() as schema:
        yield schema


async def refused_then_migrated(inbox: Inbox, rows: Any, shape: Any) -> None:
    """The inbox is as it was before the interrupted run; a receiver does not start on it
    without migrating; ``receiver migrate`` then migrates it with every row kept."""
    assert await inbox.version() == FROM
    assert await inbox.shape() == shape
    assert await inbox.rows() == rows

    code, _out, err = await run_cli("serve", "--config", str(inbox.manual))
    assert code == 1, err
    assert_one_clean_line(err)
    assert f"has schema version {FROM}, this release" in err
    assert "run `receiver migrate` to upgrade it" in err and "`receiver migrate status`" in err
    assert await inbox.version() == FROM

    code, out, err = await run_cli("migrate", "--config", str(inbox.config))
    assert code == 0, err
    assert f"migrated from version {FROM} to {LATEST} (applied {APPLIED})" in out
    assert await inbox.version() == LATEST
    assert await inbox.rows() == rows


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_migration_that_dies_half_way_leaves_the_old_version_and_runs_again(
    tmp_path: Path, backend: str
) -> None:
    async with schema_for(backend) as schema:
        inbox = Inbox(tmp_path, backend, schema)
        await inbox.make(FROM, events=300)
        rows, shape = await inbox.rows(), await inbox.shape()

        # Dies after the third pending migration ran, before the transaction commits.
        code, out, err = await run_cli(
            "migrate", "--config", str(inbox.config), env={ENV_VAR: "mid_migration:3"}
        )
        assert code == EXIT_CODE, err
        assert "fault injected: mid_migration" in err
        assert "migrated" not in out

        await refused_then_migrated(inbox, rows, shape)


async def test_a_postgres_migration_killed_while_it_waits_half_way_is_rolled_back(
    tmp_path: Path,
) -> None:
    require_postgres()
    async with fresh_schema() as schema:
        inbox = Inbox(tmp_path, "postgres", schema)
        await inbox.make(FROM, events=300)
        rows, shape = await inbox.rows(), await inbox.shape()

        holder, watcher = await connect_to(schema), await connect_to(schema)
        try:
            await kill_while_it_waits(inbox, holder, watcher)
        finally:
            await holder.close()
            await watcher.close()

        await refused_then_migrated(inbox, rows, shape)


async def kill_while_it_waits(inbox: Inbox, holder: Any, watcher: Any) -> None:
    """Run ``receiver migrate`` while ``holder`` reads the events table in an open transaction:
    migrations 3 to 5 go past (an index, new tables), migration 6's ALTER TABLE events waits for
    that transaction. SIGKILL the process then; end the transaction; wait until Postgres has
    ended the killed client's session (and so its transaction)."""
    reader = holder.transaction()
    await reader.start()
    await holder.fetchval("SELECT count(*) FROM events")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "receiver",
        "migrate",
        "--config",
        str(inbox.config),
        cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    waiting: list[Any] = []

    async def migration_waits() -> bool:
        waiting[:] = await watcher.fetch(
            "SELECT a.pid, a.query FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
            "WHERE l.relation = to_regclass('events') AND NOT l.granted"
        )
        return bool(waiting)

    try:
        await wait_for(migration_waits, timeout=30, what="the migration to wait on events")
        [(pid, query)] = waiting
        assert "ADD COLUMN trace" in query  # migration 6: 3, 4 and 5 ran before it
        proc.kill()  # SIGKILL
        assert await proc.wait() == -9
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await reader.rollback()

    async def session_gone() -> bool:
        found = await watcher.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid)
        return bool(found == 0)

    await wait_for(session_gone, what="Postgres to end the killed client's session")
