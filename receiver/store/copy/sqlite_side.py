"""A SQLite inbox as a copy reads or writes it, on one aiosqlite connection.

The source is opened without creating anything (a file that is not there is an error, never a
new inbox) and read only (``query_only``); its snapshot is one read transaction, which WAL
keeps consistent while a receiver goes on writing the file. The target writes each batch in one
``BEGIN IMMEDIATE`` transaction, in its turn with the other processes writing the file
(:class:`~receiver.store.sqlite.writer_turns.WriterTurns`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from receiver.errors import StoreError, StoreUnavailable
from receiver.store.copy.locations import Location
from receiver.store.copy.side import Key, TableReads, page_query
from receiver.store.copy.tables import ROWID_COLUMNS, Column, Table, quoted
from receiver.store.sqlite.faults import _unavailable
from receiver.store.sqlite.schema import (
    BEGIN_READ,
    BEGIN_WRITE,
    CHECKPOINT_TRUNCATE,
    COMMIT,
    PRAGMA_FOREIGN_KEYS,
    PRAGMA_QUERY_ONLY,
    PRAGMA_SYNC_FULL,
    PRAGMA_USER_VERSION,
    ROLLBACK,
)
from receiver.store.sqlite.writer_turns import WriterTurns

BUSY_SECONDS = 30.0
QUERY_AND_WRITE = "PRAGMA query_only = OFF"
# Each batch updates every index of its table at random places (ids are random): with SQLite's
# default 2 MiB page cache most of those pages are read again from the file. 64 MiB (a bound,
# whatever the inbox's size) keeps the indexes' upper levels and recent pages in memory.
WRITER_CACHE = "PRAGMA cache_size = -65536"
TABLES = (
    "SELECT name, sql FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' "
    "ESCAPE '\\' ORDER BY name"
)


class SqliteSide(TableReads):
    """One SQLite inbox of a copy; :meth:`open` it first."""

    def __init__(self, location: Location) -> None:
        assert location.path is not None
        self.location = location
        self.path: Path = location.path
        self._conn: aiosqlite.Connection | None = None
        self._turns: WriterTurns | None = None
        self._in_snapshot = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect to the existing file, reading only (a missing file is a StoreUnavailable
        naming it; nothing is created)."""
        if not self.path.exists():
            relative = (
                ""
                if self.path.is_absolute()
                else f" (a sqlite:/// path is relative to the working directory {Path.cwd()})"
            )
            raise StoreUnavailable(
                f"{self.location.named}: no inbox at {self.path.absolute()}{relative}"
            )
        # Read-write when allowed (the last connection to close then removes the -wal and -shm
        # files it made); a file this user may only read is still copied.
        mode = "rw" if os.access(self.path, os.W_OK) else "ro"
        uri = f"{self.path.absolute().as_uri()}?mode={mode}"
        try:
            self._conn = await aiosqlite.connect(
                uri, uri=True, timeout=BUSY_SECONDS, isolation_level=None
            )
            await self._conn.execute(PRAGMA_FOREIGN_KEYS)
            await self._conn.execute(PRAGMA_QUERY_ONLY)
        except sqlite3.Error as exc:
            await self.close()
            raise self._unavailable(exc) from exc

    async def prepare_writes(self) -> None:
        """From now on, :meth:`write` may write (each commit durable, in the writers' turn)."""
        await self._rows(QUERY_AND_WRITE)
        await self._rows(PRAGMA_SYNC_FULL)
        await self._rows(WRITER_CACHE)
        self._turns = WriterTurns(self.path, BUSY_SECONDS)
        self._turns.open()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error, ValueError):
                if self._in_snapshot:
                    await conn.execute(COMMIT)
                await conn.close()
        self._in_snapshot = False
        if self._turns is not None:
            self._turns.close()
            self._turns = None

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        err = _unavailable(exc, self.path)
        return StoreUnavailable(f"{self.location.option}: {err.message}")

    async def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        assert self._conn is not None
        try:
            return list(await self._conn.execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc

    async def _select(self, sql: str) -> list[Sequence[Any]]:
        return await self._rows(sql)

    # -- reading --------------------------------------------------------------------------------

    async def version(self) -> int:
        ((version,),) = await self._rows(PRAGMA_USER_VERSION)
        return int(version)

    async def tables(self) -> dict[str, Table]:
        found = {}
        for name, sql in await self._rows(TABLES):
            info = await self._rows(f"PRAGMA table_info({quoted(name)})")
            columns = [Column(row[1], str(row[2]).lower()) for row in info]
            key = tuple(row[1] for row in sorted(info, key=lambda r: r[5]) if row[5])
            alias = ROWID_COLUMNS.get(name)
            if alias and "WITHOUT ROWID" not in str(sql).upper():
                columns.insert(0, Column(alias, "integer", sql="rowid"))
            parents = await self._rows(f"PRAGMA foreign_key_list({quoted(name)})")
            found[name] = Table(name, tuple(columns), key, tuple(sorted({p[2] for p in parents})))
        return found

    async def snapshot(self) -> None:
        # BEGIN alone takes no snapshot: the first read does, and holds it until COMMIT.
        await self._rows(BEGIN_READ)
        self._in_snapshot = True
        await self._rows("SELECT count(*) FROM sqlite_schema")

    async def page(
        self,
        table: str,
        columns: Sequence[Column],
        key: Sequence[str],
        after: Key | None,
        limit: int,
    ) -> list[Sequence[Any]]:
        sql = page_query(table, columns, key, after=after is not None, mark=lambda _: "?")
        return await self._rows(sql, (*(after or ()), limit))

    # -- writing --------------------------------------------------------------------------------

    async def write(
        self,
        table: Table,
        columns: Sequence[Column],
        values: Sequence[Sequence[Any]],
        *,
        skip_existing: bool,
    ) -> int:
        assert self._conn is not None and self._turns is not None
        names = ", ".join(column.ref for column in columns)
        marks = ", ".join("?" for _ in columns)
        skip = " ON CONFLICT DO NOTHING" if skip_existing else ""
        sql = f"INSERT INTO {quoted(table.name)} ({names}) VALUES ({marks}){skip}"
        rows = list(zip(*values, strict=True))
        conn = self._conn
        async with self._turns:
            try:
                await conn.execute(BEGIN_WRITE)
                try:
                    before = conn.total_changes
                    await conn.executemany(sql, rows)
                    inserted = conn.total_changes - before
                    await conn.execute(COMMIT)
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        await conn.execute(ROLLBACK)
                    raise
            except sqlite3.IntegrityError as exc:
                raise StoreError(
                    f"{self.location.option}: table {table.name}: a row was refused ({exc})"
                ) from exc
            except sqlite3.Error as exc:
                raise self._unavailable(exc) from exc
        return int(inserted)

    async def finish(self, tables: Sequence[Table]) -> None:
        """Fold the write-ahead log into the database file."""
        await self._rows(CHECKPOINT_TRUNCATE)


def serving_processes(path: Path) -> list[tuple[int, str]]:
    """The other processes that have the SQLite file at ``path`` open (each holds a POSIX lock
    on it while its connections are open), with what each runs, as read from Linux's /proc;
    nothing elsewhere, or when it cannot be read."""
    try:
        inode = path.stat().st_ino
        text = Path("/proc/locks").read_text()
    except OSError:
        return []
    pids = set()
    for line in text.splitlines():
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "POSIX":
            continue  # a process waiting for a lock, or not a lock SQLite takes
        if fields[5].rsplit(":", 1)[-1] == str(inode) and fields[4].isdigit():
            pids.add(int(fields[4]))
    pids.discard(os.getpid())
    return [(pid, _command(pid)) for pid in sorted(pids)]


def _command(pid: int) -> str:
    """What process ``pid`` runs, shortly: ``receiver serve`` for a serving receiver."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "unknown"
    words = [os.path.basename(a.decode(errors="replace")) for a in argv if a]
    if "receiver" in words and "serve" in words:
        return "receiver serve"
    return words[0] if words else "unknown"
