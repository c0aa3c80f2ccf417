"""Creating and upgrading the Postgres inbox's schema, once for all replicas (a mixin)."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from receiver import faults
from receiver.config.settings import StoreSettings
from receiver.errors import StoreNewer, StoreUnavailable
from receiver.logs import get_logger
from receiver.store.postgres.errors import _DB_ERRORS
from receiver.store.postgres.schema import (
    CREATE_MIGRATIONS_TABLE,
    CURRENT_SCHEMA,
    MIGRATION_LOCK,
    MIGRATIONS,
    MIGRATIONS_TABLE_EXISTS,
    RECORD_MIGRATION,
    SCHEMA_EXISTS,
    SCHEMA_VERSION,
    SCHEMA_VERSION_QUERY,
    _quote_ident,
)
from receiver.store.sql.versions import behind

T = TypeVar("T")

log = get_logger("receiver.store.postgres")

#: Statements of a migration, and waiting for another replica's migration, may take this long.
MIGRATION_TIMEOUT_SECONDS = 600.0
#: The crash point (``RECEIVER_FAULT_INJECT``) reached after each migration, before the commit.
FAULT_POINT = "mid_migration"


@dataclass(frozen=True)
class MigrationReport:
    """What :meth:`PostgresStore.migrate` found and did."""

    schema: str
    before: int
    after: int
    applied: tuple[int, ...]


def _lock_key(schema: str) -> int:
    """A stable 64-bit advisory lock key for migrating ``schema`` (per database)."""
    digest = hashlib.sha256(b"receiver.migrate:" + schema.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PostgresMigrations:
    """``migrate`` and the schema check on opening, of the Postgres store."""

    if TYPE_CHECKING:
        settings: StoreSettings
        where: str
        _schema: str

        async def _connect(self) -> Any: ...

        async def _close_conn(self, conn: Any) -> None: ...

        def _unavailable(self, exc: BaseException) -> StoreUnavailable: ...

        def _bad_url(self, exc: ValueError) -> StoreUnavailable: ...

    async def migrate(self) -> MigrationReport:
        """Create or upgrade the schema (whatever ``auto_migrate`` says); safe to run at once
        from several processes."""
        return await self._on_own_connection(lambda conn: self._migrate(conn, apply=True))

    async def schema_version(self) -> tuple[str, int]:
        """The schema's name and version now (0: no schema or no table of the receiver's yet),
        read without writing anything."""

        async def read(conn: Any) -> tuple[str, int]:
            await self._find_schema(conn)
            return self._schema, await self._version(conn)

        return await self._on_own_connection(read)

    async def _on_own_connection(self, body: Callable[[Any], Awaitable[T]]) -> T:
        """``body`` on a connection of its own (not the pool's), closed after; a bad URL or an
        unreachable database raised as :class:`StoreUnavailable`."""
        try:
            conn = await self._connect()
            try:
                return await body(conn)
            finally:
                await self._close_conn(conn)
        except ValueError as exc:
            raise self._bad_url(exc) from exc
        except _DB_ERRORS as exc:
            raise self._unavailable(exc) from exc

    @property
    def inbox(self) -> str:
        """The inbox as the messages name it: its url (no password) and schema."""
        return f"the Postgres inbox {self.where} (schema {self._schema})"

    async def _find_schema(self, conn: Any) -> None:
        if not self._schema:
            schema = await conn.fetchval(CURRENT_SCHEMA)
            if schema is None:
                raise StoreUnavailable(
                    f"the Postgres inbox {self.where} has no schema on its search_path; "
                    "set store.schema"
                )
            self._schema = str(schema)

    async def _migrate(self, conn: Any, *, apply: bool) -> MigrationReport:
        await self._find_schema(conn)
        before = await self._version(conn)
        if before > SCHEMA_VERSION:
            raise StoreNewer(self.inbox, before, SCHEMA_VERSION)
        if before == SCHEMA_VERSION:
            return MigrationReport(self._schema, before, before, ())
        if not apply:
            raise behind(self.inbox, before, SCHEMA_VERSION)
        async with conn.transaction():
            # Held until commit: replicas starting together queue here, and each one after the
            # first finds the schema up to date.
            await conn.execute(
                MIGRATION_LOCK, _lock_key(self._schema), timeout=MIGRATION_TIMEOUT_SECONDS
            )
            # Asked only when missing: creating needs a privilege on the database that a role
            # given a ready-made schema by its DBA does not have.
            if self.settings.schema and not await conn.fetchval(SCHEMA_EXISTS, self._schema):
                await conn.execute("CREATE SCHEMA " + _quote_ident(self._schema))
            await conn.execute(CREATE_MIGRATIONS_TABLE)
            current = int(await conn.fetchval(SCHEMA_VERSION_QUERY))
            if current > SCHEMA_VERSION:  # a newer release migrated meanwhile
                raise StoreNewer(self.inbox, current, SCHEMA_VERSION)
            applied = []
            # Every pending migration in this one transaction: a process killed half way
            # leaves the schema as it was, and the next run migrates it from there.
            for migration in MIGRATIONS[current:]:
                for statement in migration.statements:
                    await conn.execute(statement, timeout=MIGRATION_TIMEOUT_SECONDS)
                await conn.execute(RECORD_MIGRATION, migration.version, migration.description)
                applied.append(migration.version)
                faults.reached(FAULT_POINT)
        if applied:
            log.info("inbox schema migrated", schema=self._schema, versions=applied)
        return MigrationReport(self._schema, before, SCHEMA_VERSION, tuple(applied))

    @staticmethod
    async def _version(conn: Any) -> int:
        if not await conn.fetchval(MIGRATIONS_TABLE_EXISTS):
            return 0
        return int(await conn.fetchval(SCHEMA_VERSION_QUERY))
