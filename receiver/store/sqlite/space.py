"""The SQLite inbox's disk space (a mixin of :class:`~receiver.store.sqlite.SqliteStore`).

Deleted rows leave free pages inside the file; new rows reuse them, so at a steady state of
arrivals and expiries the file stops growing, but it never shrinks by itself. An inbox made with
``auto_vacuum = INCREMENTAL`` (every inbox this release creates; ``receiver store vacuum`` converts
an older one, see :func:`vacuum`) keeps the bookkeeping that lets
``PRAGMA incremental_vacuum`` move the last pages into free ones and cut the file's tail, a
bounded number of pages a transaction: the retention loop (:mod:`receiver.ops.retention`) gives
back what a prune freed, a step at a time, between intake's groups.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import aiosqlite

from receiver.errors import StoreUnavailable
from receiver.store.space import InboxSpace
from receiver.store.sqlite.restore import claimed

T = TypeVar("T")

AUTO_VACUUM_INCREMENTAL = 2
PRAGMA_AUTO_VACUUM_INCREMENTAL = "PRAGMA auto_vacuum = INCREMENTAL"
SPACE = """
SELECT (SELECT page_size FROM pragma_page_size),
       (SELECT freelist_count FROM pragma_freelist_count),
       (SELECT auto_vacuum FROM pragma_auto_vacuum)
"""
FREELIST = "PRAGMA freelist_count"
PRAGMA_AUTO_VACUUM = "PRAGMA auto_vacuum"


def file_bytes(path: Path) -> int:
    """The database file and its WAL, as they take space on disk now."""
    total = 0
    for suffix in ("", "-wal"):
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(f"{path}{suffix}").st_size
    return total


class SqliteSpace:
    """:meth:`space` and :meth:`reclaim_space` of the SQLite store."""

    if TYPE_CHECKING:
        path: Path

        async def _read_tx(self, fn: Callable[[aiosqlite.Connection], Awaitable[T]]) -> T: ...

        async def _write_tx(
            self,
            fn: Callable[[aiosqlite.Connection], Awaitable[T]],
            *,
            durable: bool = True,
            own_transaction: bool = False,
        ) -> T: ...

    async def space(self) -> InboxSpace | None:
        ((page_size, free_pages, auto_vacuum),) = await self._read_tx(
            lambda conn: conn.execute_fetchall(SPACE)
        )
        return InboxSpace(
            file_bytes=file_bytes(self.path),
            free_bytes=int(page_size) * int(free_pages),
            reclaimable=int(auto_vacuum) == AUTO_VACUUM_INCREMENTAL,
        )

    async def reclaim_space(self, *, max_pages: int) -> int:
        # sqlite3 steps a PRAGMA that returns no rows once, which moves a single page: a script
        # is stepped to its end.
        script = f"BEGIN IMMEDIATE; PRAGMA incremental_vacuum({max(int(max_pages), 1)}); COMMIT;"

        async def run(conn: aiosqlite.Connection) -> int:
            ((page_size, before, auto_vacuum),) = await conn.execute_fetchall(SPACE)
            if int(auto_vacuum) != AUTO_VACUUM_INCREMENTAL or not before:
                return 0
            try:
                await conn.executescript(script)
            except sqlite3.Error:
                if conn.in_transaction:
                    await conn.execute("ROLLBACK")
                raise
            ((after,),) = await conn.execute_fetchall(FREELIST)
            return int(page_size) * (int(before) - int(after))

        # Not durable: the next intake commit or checkpoint syncs it (nothing is lost if a power
        # cut undoes it: the pages are free again, to give back at the next step).
        return await self._write_tx(run, durable=False, own_transaction=True)


@dataclass(frozen=True)
class Vacuumed:
    """What :func:`vacuum` did: the file's bytes before and after, the seconds it took, and
    whether it converted an inbox made before incremental vacuum."""

    before: int
    after: int
    seconds: float
    converted: bool


def vacuum(path: Path, say: Callable[[str], None]) -> Vacuumed:
    """Rewrite the inbox at ``path`` whole (``VACUUM``), giving back every free page, with
    ``auto_vacuum = INCREMENTAL`` from then on (an inbox made before it could not give pages
    back; the setting takes effect only through a VACUUM). Refused while another process has
    the inbox open (:func:`~.restore.claimed`). VACUUM is one transaction: stopped or short of
    space (it needs about the file's size free, in the temporary directory and beside the
    inbox), it leaves the inbox as it was."""
    with claimed(path, say, until="vacuumed") as conn:
        if conn is None:
            raise StoreUnavailable(f"no SQLite inbox SQLite can read at {path}")
        ((mode,),) = conn.execute(PRAGMA_AUTO_VACUUM).fetchall()
        before = file_bytes(path)
        started = time.monotonic()
        conn.execute(PRAGMA_AUTO_VACUUM_INCREMENTAL)
        try:
            conn.execute("VACUUM")
        except sqlite3.Error as exc:
            raise StoreUnavailable(
                f"the inbox {path} was not vacuumed ({exc}); it is as it was"
                + (
                    ": VACUUM needs about the file's size free in the temporary directory "
                    "and beside the inbox"
                    if "full" in str(exc).lower()
                    else ""
                )
            ) from exc
        conn.execute("PRAGMA journal_mode = WAL").fetchall()
        return Vacuumed(
            before,
            file_bytes(path),
            time.monotonic() - started,
            int(mode) != AUTO_VACUUM_INCREMENTAL,
        )
