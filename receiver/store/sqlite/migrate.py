"""Upgrading the SQLite inbox's schema on open (``PRAGMA user_version``; the migrations are in
:mod:`.schema`), once for all the processes sharing the file (a mixin).

Every pending migration runs in one transaction, holding the write lock and the writers' turn
of the processes sharing the file: a process killed half way leaves the inbox at the version it
had, and the next open migrates it again from there. Before migrating an inbox that holds data
(version 1 or later), a copy of it is written beside it (:mod:`.backup_copy`) inside that same
turn, so it is exactly the inbox as it was; the newest :data:`KEEP_COPIES` are kept. An inbox a
newer release wrote is refused before anything touches the file.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import aiosqlite

from receiver import faults
from receiver.config.settings import StoreSettings
from receiver.errors import StoreNewer, StoreUnavailable
from receiver.logs import get_logger
from receiver.store.sql.versions import behind
from receiver.store.sqlite.backup_copy import prune, write_copy
from receiver.store.sqlite.schema import MIGRATIONS, PRAGMA_USER_VERSION, SCHEMA_VERSION

T = TypeVar("T")

log = get_logger("receiver.store.sqlite")

#: The kind of the copies written before a migration: ``<inbox>.before-migrate-v<from>-<time>``.
COPY_KIND = "before-migrate"
#: How many of those copies are kept beside the inbox (the older ones are removed).
KEEP_COPIES = 3
#: The crash point (``RECEIVER_FAULT_INJECT``) reached after each migration, before the commit.
FAULT_POINT = "mid_migration"


@dataclass(frozen=True)
class SqliteMigrationReport:
    """What opening the inbox did to its schema: the versions before and after, those applied,
    and the copy of the inbox written before (None for a new inbox, or when nothing ran)."""

    before: int
    after: int
    applied: tuple[int, ...]
    backup: Path | None = None


def read_version(path: Path, busy_timeout: float) -> int | None:
    """The schema version of the inbox file at ``path`` (0: a new, empty file), or None when
    there is no file; writes nothing (raises ``sqlite3.Error`` for a file that is not an inbox
    SQLite can read)."""
    if not path.exists():
        return None
    # Read-write, not read-only: the last connection to a WAL file to close removes the -wal
    # and -shm files it found or made; a read-only one leaves them behind.
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
    try:
        ((version,),) = conn.execute(PRAGMA_USER_VERSION).fetchall()
        return int(version)
    finally:
        conn.close()


def named(path: Path) -> str:
    """The inbox at ``path`` as messages name it."""
    return f"the inbox {path}"


def newer(path: Path, version: int) -> StoreNewer:
    return StoreNewer(named(path), version, SCHEMA_VERSION)


class SqliteMigrations:
    """The schema check and upgrade of :class:`~receiver.store.sqlite.store.SqliteStore`:
    :meth:`_refuse_early` before the file is opened, :meth:`_migrate` on its intake connection
    while it holds the writer's turn."""

    #: What the last open did to the schema (None until a migration ran).
    migration: SqliteMigrationReport | None = None

    if TYPE_CHECKING:
        settings: StoreSettings
        path: Path
        busy_timeout: float

        async def _transaction(
            self, conn: aiosqlite.Connection, body: Callable[[aiosqlite.Connection], Awaitable[T]]
        ) -> T: ...

    async def _refuse_early(self) -> None:
        """Before anything opens the file for writing (WAL mode, the start-up check): refuse
        an inbox written by a newer release, or one behind when ``store.auto_migrate`` is off,
        leaving it as it was. A file SQLite cannot read is left to the open to name."""
        try:
            version = await asyncio.to_thread(read_version, self.path, self.busy_timeout)
        except sqlite3.Error:
            return
        if version is None or version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise newer(self.path, version)
        if not self.settings.auto_migrate:
            raise behind(named(self.path), version, SCHEMA_VERSION)

    async def _migrate(self, conn: aiosqlite.Connection) -> None:
        version = await _user_version(conn)
        if version == SCHEMA_VERSION:
            return  # nothing to write: opening a read-only file still works
        if version > SCHEMA_VERSION:
            raise newer(self.path, version)
        if not self.settings.auto_migrate:
            raise behind(named(self.path), version, SCHEMA_VERSION)
        report = await self._transaction(conn, self._upgrade)
        self.migration = report
        if not report.applied or not report.before:
            return  # another process migrated meanwhile, or a new inbox: nothing to say
        removed = (
            await asyncio.to_thread(prune, self.path, COPY_KIND, KEEP_COPIES)
            if report.backup
            else []
        )
        log.info(
            "inbox schema migrated",
            path=str(self.path),
            before=report.before,
            after=report.after,
            versions=list(report.applied),
            backup=str(report.backup) if report.backup else None,
            older_copies_removed=[str(p) for p in removed],
        )

    async def _upgrade(self, conn: aiosqlite.Connection) -> SqliteMigrationReport:
        """Inside the write transaction: copy the inbox, then apply every pending migration."""
        # Read again under the write lock: another process may have migrated meanwhile.
        before = await _user_version(conn)
        if before > SCHEMA_VERSION:
            raise newer(self.path, before)
        backup = None
        if 0 < before < SCHEMA_VERSION:
            backup = await asyncio.to_thread(functools.partial(self._copy, before))
            log.info("inbox copied before migrating", path=str(self.path), backup=str(backup))
        applied = []
        for version in range(before + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version - 1]:
                await conn.execute(statement)
            applied.append(version)
            faults.reached(FAULT_POINT)
        return SqliteMigrationReport(before, SCHEMA_VERSION, tuple(applied), backup)

    def _copy(self, version: int) -> Path:
        """The copy of the inbox (at ``version``) kept before migrating it; run on a thread,
        on a connection of its own, while the intake connection holds the write lock."""
        try:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
            try:
                return write_copy(conn, self.path, f"{COPY_KIND}-v{version}")
            finally:
                conn.close()
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(
                f"the inbox {self.path} was not migrated: the copy of it to keep first could "
                f"not be written beside it ({_reason(exc)}); nothing was changed: make room "
                "or make its directory writable and try again"
            ) from exc


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


async def _user_version(conn: aiosqlite.Connection) -> int:
    ((version,),) = await conn.execute_fetchall(PRAGMA_USER_VERSION)
    return int(version)
