"""A Postgres inbox as a copy reads or writes it, on one asyncpg connection.

The source's snapshot is one ``REPEATABLE READ READ ONLY`` transaction. The target writes each
batch in a transaction of its own: into an empty inbox with ``COPY``; when adding to one that
has rows, as one ``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING`` (one array per
column), which skips a row whose key is already there. Identity columns are written as the
source had them (``OVERRIDING SYSTEM VALUE``) and their sequences moved past the largest value
afterwards, so the target's receivers number new rows after the copied ones; the copied tables
are then analysed, so the planner knows their size at once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncpg

from receiver.errors import StoreError, StoreUnavailable
from receiver.store.copy.locations import Location
from receiver.store.copy.side import Key, TableReads, page_query
from receiver.store.copy.tables import Column, Table, quoted
from receiver.store.postgres.errors import _DB_ERRORS
from receiver.store.postgres.schema import MIGRATIONS_TABLE_EXISTS, SCHEMA_VERSION_QUERY

CONNECT_SECONDS = 10.0
#: A statement that takes longer (a batch, a count, an analyse) means a stuck database.
STATEMENT_SECONDS = 600.0

COLUMNS = """
SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attidentity <> ''
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY c.relname, a.attnum
"""
KEYS = """
SELECT c.relname, a.attname
FROM pg_constraint con
JOIN pg_class c ON c.oid = con.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL unnest(con.conkey) WITH ORDINALITY AS k (attnum, ord)
JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum
WHERE n.nspname = current_schema() AND con.contype = 'p'
ORDER BY c.relname, k.ord
"""
PARENTS = """
SELECT c.relname, p.relname
FROM pg_constraint con
JOIN pg_class c ON c.oid = con.conrelid
JOIN pg_class p ON p.oid = con.confrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND con.contype = 'f'
"""
SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
MOVE_SEQUENCE = (
    "SELECT setval(pg_get_serial_sequence($1, $2), coalesce(max({column}), 0) + 1, false) "
    "FROM {table}"
)


class PostgresSide(TableReads):
    """One Postgres inbox of a copy; :meth:`open` it first."""

    def __init__(self, location: Location) -> None:
        self.location = location
        self._conn: Any = None
        self._in_snapshot = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def open(self) -> None:
        settings: dict[str, str] = {}
        # Named in pg_stat_activity; a url's own ?application_name=... wins.
        if "application_name" not in parse_qs(urlsplit(self.location.url).query):
            settings["application_name"] = "receiver store copy"
        if self.location.schema:
            settings["search_path"] = quoted(self.location.schema)
        try:
            self._conn = await asyncpg.connect(
                dsn=self.location.url,
                timeout=CONNECT_SECONDS,
                command_timeout=STATEMENT_SECONDS,
                server_settings=settings,
            )
        except ValueError as exc:
            raise StoreUnavailable(
                f"{self.location.named}: not a usable postgresql:// url ({_first_line(exc)})"
            ) from exc
        except _DB_ERRORS as exc:
            raise self._unavailable(exc) from exc

    async def prepare_writes(self) -> None:
        """Nothing to do: each batch is a transaction of its own."""

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                if self._in_snapshot:
                    await conn.execute("ROLLBACK")
                await conn.close(timeout=CONNECT_SECONDS)
            except _DB_ERRORS:
                conn.terminate()
        self._in_snapshot = False

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        named = self.location.named
        if isinstance(exc, TimeoutError):
            message = f"{named}: did not answer in time"
        elif isinstance(exc, ConnectionRefusedError):
            message = f"{named}: cannot connect: connection refused"
        elif isinstance(exc, OSError):
            message = f"{named}: cannot connect: {exc.strerror or exc}"
        else:
            message = f"{named}: {_first_line(exc)}"
        return StoreUnavailable(message)

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        try:
            return list(await self._conn.fetch(sql, *args))
        except _DB_ERRORS as exc:
            raise self._unavailable(exc) from exc

    async def _select(self, sql: str) -> list[Sequence[Any]]:
        return await self._fetch(sql)

    # -- reading --------------------------------------------------------------------------------

    async def version(self) -> int:
        [(exists,)] = await self._fetch(MIGRATIONS_TABLE_EXISTS)
        if not exists:
            return 0
        [(version,)] = await self._fetch(SCHEMA_VERSION_QUERY)
        return int(version)

    async def tables(self) -> dict[str, Table]:
        columns: dict[str, list[Column]] = {}
        for table, name, type_, generated in await self._fetch(COLUMNS):
            columns.setdefault(table, []).append(Column(name, str(type_).lower(), generated))
        keys: dict[str, list[str]] = {}
        for table, name in await self._fetch(KEYS):
            keys.setdefault(table, []).append(name)
        parents: dict[str, set[str]] = {}
        for table, parent in await self._fetch(PARENTS):
            parents.setdefault(table, set()).add(parent)
        return {
            table: Table(
                table,
                tuple(cols),
                tuple(keys.get(table, ())),
                tuple(sorted(parents.get(table, ()))),
            )
            for table, cols in columns.items()
        }

    async def snapshot(self) -> None:
        await self._fetch(SNAPSHOT)
        self._in_snapshot = True

    async def page(
        self,
        table: str,
        columns: Sequence[Column],
        key: Sequence[str],
        after: Key | None,
        limit: int,
    ) -> list[Sequence[Any]]:
        sql = page_query(table, columns, key, after=after is not None, mark=lambda n: f"${n}")
        return await self._fetch(sql, *(after or ()), limit)

    # -- writing --------------------------------------------------------------------------------

    async def write(
        self,
        table: Table,
        columns: Sequence[Column],
        values: Sequence[Sequence[Any]],
        *,
        skip_existing: bool,
    ) -> int:
        try:
            async with self._conn.transaction():
                if skip_existing:
                    status = await self._conn.execute(_insert(table, columns), *map(list, values))
                else:  # into an empty inbox: COPY, several times faster; a key twice fails
                    status = await self._conn.copy_records_to_table(
                        table.name,
                        records=list(zip(*values, strict=True)),
                        columns=[column.name for column in columns],
                    )
        except (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError) as exc:
            raise StoreError(
                f"{self.location.option}: table {table.name}: a row was refused "
                f"({_first_line(exc)})"
            ) from exc
        except _DB_ERRORS as exc:
            raise self._unavailable(exc) from exc
        return int(status.rsplit(" ", 1)[-1])

    async def finish(self, tables: Sequence[Table]) -> None:
        """Move each identity's sequence past the copied values; analyse the tables."""
        for table in tables:
            for column in table.columns:
                if column.generated:
                    sql = MOVE_SEQUENCE.format(column=quoted(column.name), table=quoted(table.name))
                    await self._fetch(sql, quoted(table.name), column.name)
            await self._fetch(f"ANALYZE {quoted(table.name)}")


def _insert(table: Table, columns: Sequence[Column]) -> str:
    """The batch insert that skips a row whose key is there: one array parameter per column."""
    names = ", ".join(quoted(column.name) for column in columns)
    arrays = ", ".join(f"${n + 1}::{column.type}[]" for n, column in enumerate(columns))
    overriding = " OVERRIDING SYSTEM VALUE" if any(c.generated for c in columns) else ""
    return (
        f"INSERT INTO {quoted(table.name)} ({names}){overriding} "
        f"SELECT * FROM unnest({arrays}) ON CONFLICT DO NOTHING"
    )


_ARGUMENT = re.compile(r"^invalid input for query argument \$\d+: .*?\((.*)\)$", re.S)


def _first_line(exc: BaseException) -> str:
    """The driver's message, short: its first line, without the values it may quote (a
    refused argument's message repeats the whole array)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    found = _ARGUMENT.match(str(exc).strip())
    if found:
        text = found.group(1)
    return text if len(text) <= 200 else text[:197] + "..."
