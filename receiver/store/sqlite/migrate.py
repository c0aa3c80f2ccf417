"""Upgrading the SQLite inbox's schema on open (``PRAGMA user_version``; the migrations are in
:mod:`.schema`), once for all the processes sharing the file (a mixin)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import aiosqlite

from receiver.config.settings import StoreSettings
from receiver.errors import StoreUnavailable
from receiver.store.sqlite.schema import MIGRATIONS, PRAGMA_USER_VERSION, SCHEMA_VERSION

T = TypeVar("T")


class SqliteMigrations:
    """The schema check and upgrade of :class:`~receiver.store.sqlite.store.SqliteStore`,
    run on its intake connection while it holds the writer's turn."""

    if TYPE_CHECKING:
        settings: StoreSettings
        path: Path

        async def _transaction(
            self, conn: aiosqlite.Connection, body: Callable[[aiosqlite.Connection], Awaitable[T]]
        ) -> T: ...

    async def _migrate(self, conn: aiosqlite.Connection) -> None:
        version = await _user_version(conn)
        if version == SCHEMA_VERSION:
            return  # nothing to write: opening a read-only file still works
        if version > SCHEMA_VERSION:
            raise StoreUnavailable(
                f"the inbox database {self.path} has schema version {version}, newer than this "
                f"receiver knows ({SCHEMA_VERSION}); upgrade the receiver"
            )
        if not self.settings.auto_migrate:
            raise StoreUnavailable(
                f"the inbox database {self.path} has schema version {version}, this receiver "
                f"needs {SCHEMA_VERSION}; enable store.auto_migrate"
            )

        async def apply(conn: aiosqlite.Connection) -> None:
            # Read again under the write lock: another process may have migrated meanwhile.
            for statements in MIGRATIONS[await _user_version(conn) :]:
                for statement in statements:
                    await conn.execute(statement)

        await self._transaction(conn, apply)


async def _user_version(conn: aiosqlite.Connection) -> int:
    ((version,),) = await conn.execute_fetchall(PRAGMA_USER_VERSION)
    return int(version)
