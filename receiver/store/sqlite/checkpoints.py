"""The SQLite store's checkpoints, off the commit path, and its pragma report (a mixin)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiosqlite

from receiver.errors import StoreUnavailable
from receiver.store.sqlite.faults import _DB_ERRORS, _close_quietly
from receiver.store.sqlite.schema import CHECKPOINT, CHECKPOINT_TRUNCATE, PRAGMA_SETTINGS

if TYPE_CHECKING:
    from receiver.store.sqlite.file_sync import FileSync
    from receiver.store.sqlite.writer_turns import WriterTurns


# Checkpoints run on their own connection, once this many events and jobs were written since the
# last one, or at least every CHECKPOINT_INTERVAL_SECONDS when anything was: a checkpoint that
# reaches the WAL's end ends with an fsync of the database file, which every other fsync on the
# disk waits behind.
#
# Pages a checkpoint copied are synced through SQLite's own descriptor of the database file
# (.file_sync): nothing here, nor anywhere in the receiver, opens the database, -wal or -shm file
# through a descriptor of its own, whose close would drop every POSIX lock this process holds on
# it, SQLite's included.
CHECKPOINT_EVERY_ITEMS = 500
CHECKPOINT_INTERVAL_SECONDS = 1.0
CHECKPOINT_RETRY_SECONDS = 0.05
# A WAL that a background checkpoint found this long (pages, ~64 MB) is finished off by the
# writer between two groups: under constant load the WAL would otherwise never restart.
WAL_RESTART_PAGES = 16000


class SqliteCheckpoints:
    """The checkpointer task and :meth:`pragmas` of :class:`~receiver.store.sqlite.SqliteStore`."""

    if TYPE_CHECKING:
        path: Path
        _checkpoint_due: asyncio.Event | None
        _since_checkpoint: int
        _wal_long: bool
        _turns: WriterTurns
        _file_sync: FileSync
        _intake: aiosqlite.Connection | None

        async def _connect(self, *, query_only: bool = False) -> aiosqlite.Connection: ...

        def _check_open(self) -> None: ...

    async def _checkpointer_main(self) -> None:
        """Copy committed WAL pages into the database file, off the commit path: once
        ``CHECKPOINT_EVERY_ITEMS`` were written, or every ``CHECKPOINT_INTERVAL_SECONDS`` when
        anything was (each checkpoint ends with an fsync every other fsync waits behind)."""
        due = self._checkpoint_due
        assert due is not None
        conn: aiosqlite.Connection | None = None
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(due.wait(), CHECKPOINT_INTERVAL_SECONDS)
                due.clear()
                if not self._since_checkpoint:
                    continue
                self._since_checkpoint = 0
                try:
                    if conn is None:
                        conn = await self._connect()
                    ((_busy, wal_pages, copied),) = await conn.execute_fetchall(CHECKPOINT)
                except _DB_ERRORS:
                    if conn is not None:
                        await _close_quietly(conn)
                    conn = None  # the writers report the fault; try again later
                    self._since_checkpoint += 1
                    continue
                if copied:
                    await asyncio.to_thread(self._file_sync.sync)
                self._wal_long = wal_pages >= WAL_RESTART_PAGES
                if copied < wal_pages and self._since_checkpoint:
                    # Behind a busy writer: go again soon, without waiting for the next batch.
                    await asyncio.sleep(CHECKPOINT_RETRY_SECONDS)
                    due.set()
        finally:
            if conn is not None:
                await asyncio.shield(_close_quietly(conn))

    async def _truncate_wal(self, conn: aiosqlite.Connection) -> None:
        """Before the first commit on an intake connection reopened after a fault: copy the WAL
        into the database file and truncate it. After a full disk, new commits would otherwise
        append to a WAL that may already hold most of the disk, take the space just freed, and
        fill it again, with no room left for a checkpoint to restart the WAL."""
        with contextlib.suppress(sqlite3.Error):
            await conn.execute_fetchall(CHECKPOINT_TRUNCATE)

    async def pragmas(self) -> dict[str, Any]:
        """The settings in force on the intake connection (journal mode, synchronous, ...)."""
        self._check_open()
        async with self._turns:
            if self._intake is None:
                raise StoreUnavailable("the inbox intake connection is down")
            ((journal, sync, fks, busy, version, temp),) = await self._intake.execute_fetchall(
                PRAGMA_SETTINGS
            )
        return {
            "journal_mode": str(journal).lower(),
            "synchronous": {0: "off", 1: "normal", 2: "full", 3: "extra"}.get(sync, sync),
            "foreign_keys": bool(fks),
            "busy_timeout_ms": busy,
            "user_version": version,
            "temp_store": {0: "default", 1: "file", 2: "memory"}.get(temp, temp),
        }
