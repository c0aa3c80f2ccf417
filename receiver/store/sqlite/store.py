"""The SQLite inbox: WAL mode on aiosqlite, group commit for intake, reads on their own connection.

Concurrent :meth:`SqliteStore.add_event` calls are gathered in the event loop (see
:mod:`receiver.store.batching`) and written together: one transaction, one multi-row INSERT per
table, one commit (one fsync) for the whole group, and each caller answered only after that
commit. Workers' claims and settles run on a connection of their own, reads on a query-only one
(WAL readers never block the writer), and checkpoints on a fourth, so a commit normally only
appends to the WAL.

Any sqlite3 error that means the file is unusable (locked, read-only, full, I/O error, corrupt)
becomes :class:`~receiver.errors.StoreUnavailable` for the callers of that transaction and drops
the connection it happened on; the next transaction reconnects, so the store heals once the
fault clears.

This module holds the connections, transactions and intake; the rest of :class:`SqliteStore`
comes from the flows the SQL backends share (:mod:`receiver.store.sql`), which run the statements
of :mod:`.lanes`, :mod:`.browse` and :mod:`.pull`, from :mod:`.checkpoints` and from
:mod:`.migrate` (schema in :mod:`.schema`). Each module is named as its twin in the other
backends.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from receiver.config.settings import StoreSettings
from receiver.errors import ConfigError, StoreUnavailable
from receiver.store import rules
from receiver.store.batching import GroupCommit
from receiver.store.pull import outcome_key
from receiver.store.records import NewEvent
from receiver.store.sql.browse import SqlBrowse
from receiver.store.sql.conn import Conn
from receiver.store.sql.lanes import SqlLanes
from receiver.store.sql.pull import SqlPull
from receiver.store.sql.steps import SqlSteps
from receiver.store.sqlite.browse import SqliteBrowse
from receiver.store.sqlite.checkpoints import CHECKPOINT_EVERY_ITEMS, SqliteCheckpoints
from receiver.store.sqlite.conn import run_flow
from receiver.store.sqlite.faults import (
    _DB_ERRORS,
    _ITEM_ERRORS,
    _close_quietly,
    _is_busy,
    _unavailable,
)
from receiver.store.sqlite.file_sync import FileSync
from receiver.store.sqlite.health import check_inbox
from receiver.store.sqlite.intake import ROWS_PER_STATEMENT, _Add, write_group
from receiver.store.sqlite.lanes import SqliteLanes
from receiver.store.sqlite.migrate import SqliteMigrations
from receiver.store.sqlite.pull import SqlitePull
from receiver.store.sqlite.schema import (
    BEGIN_READ,
    BEGIN_WRITE,
    CHECKPOINT,
    COMMIT,
    PRAGMA_FOREIGN_KEYS,
    PRAGMA_JOURNAL_MODE,
    PRAGMA_JOURNAL_SIZE_LIMIT,
    PRAGMA_NO_AUTOCHECKPOINT,
    PRAGMA_QUERY_ONLY,
    PRAGMA_SYNC_FULL,
    PRAGMA_SYNC_NORMAL,
    PRAGMA_TEMP_STORE_MEMORY,
    PRAGMA_WAL,
    ROLLBACK,
)
from receiver.store.sqlite.space import PRAGMA_AUTO_VACUUM_INCREMENTAL, SqliteSpace
from receiver.store.sqlite.writer_turns import WriterTurns

T = TypeVar("T")

SQLITE_PREFIX = "sqlite:///"
PING = "SELECT count(*) FROM (SELECT 1 FROM events LIMIT 1)"


def sqlite_path(url: str) -> Path:
    """The file named by ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``."""
    if not url.startswith(SQLITE_PREFIX):
        raise ConfigError(
            "store.url: a SQLite url is sqlite:///relative/path.db or sqlite:////abs/path.db"
        )
    rest = url[len(SQLITE_PREFIX) :].split("?", 1)[0]
    if not rest or rest.endswith("/") or rest == ":memory:":
        raise ConfigError(
            "store.url: a SQLite url needs a file path (use memory:// for an in-memory inbox)"
        )
    return Path(rest)


class SqliteStore(
    SqlLanes, SqlBrowse, SqlPull, SqlSteps, SqliteCheckpoints, SqliteMigrations, SqliteSpace
):
    """The inbox in one SQLite file (WAL), on four aiosqlite connections.

    - *intake*: :meth:`add_event` calls are gathered by a
      :class:`~receiver.store.batching.GroupCommit` and written as one transaction, with one
      multi-row INSERT per table and one commit (one fsync) for the whole group.
    - *work*: what an operator or a user asks for (redelivery batches, lane pauses, watches),
      each its own short transaction, as durable as intake's.
    - *progress*: what the workers record as they go (claims, leases, settles, batch steps,
      prunes), each its own short transaction that, with ``synchronous = "full"``, commits
      without waiting for the disk (``synchronous = NORMAL``): its writes reach the disk with
      the next intake commit or checkpoint. A power loss may undo the last of them (never a
      process crash): the work is then done again, and a delivery may be sent again, as after
      a crash between sending and settling. Without this every settle would wait for an fsync
      while holding the one write lock that intake's next group waits for.
    - *read*: query-only snapshots for get, list and counts (WAL readers never wait for writers).

    Write transactions take turns (:class:`~.writer_turns.WriterTurns`, with the other
    processes writing the file too), so writers are not left sleeping in SQLite's busy
    handler; ``busy_timeout`` is how long a write waits for another process's lock before
    raising StoreUnavailable. Checkpoints (copying the WAL back into the
    database file, and its fsync) run on a fourth connection, off the commit path.

    ``path`` overrides the file named by ``settings.url``; ``max_batch`` caps the events written
    per transaction. :attr:`commit_count` counts committed write transactions.

    Any sqlite3 error that means the file is unusable (locked, read-only, full, I/O error,
    corrupt) becomes :class:`~receiver.errors.StoreUnavailable` for the callers of that
    transaction and drops the connection; the next transaction reconnects, so the store heals
    once the fault clears.
    """

    # The statements the flows written once (receiver.store.sql) run here.
    _lane_sql = SqliteLanes
    _browse_sql = SqliteBrowse
    _batch_sql = SqliteBrowse.BATCHES
    _pull_sql = SqlitePull

    def __init__(
        self,
        settings: StoreSettings,
        *,
        path: str | Path | None = None,
        busy_timeout: float = 5.0,
        max_batch: int = 1000,
        check: bool = False,
    ) -> None:
        self.settings = settings
        self.check = check  # the serving process: check (and mend) the file first (.health)
        self.path = Path(path) if path is not None else sqlite_path(settings.url)
        self.busy_timeout = busy_timeout
        self.max_batch = max(1, max_batch)
        self.commit_count = 0
        self._sync = PRAGMA_SYNC_NORMAL if settings.synchronous == "normal" else PRAGMA_SYNC_FULL
        self._intake: aiosqlite.Connection | None = None
        self._work: aiosqlite.Connection | None = None
        self._progress: aiosqlite.Connection | None = None
        self._read: aiosqlite.Connection | None = None
        # Loop-bound objects are made in open(): a store may be reopened on another event loop.
        self._adds: GroupCommit[_Add, bool] | None = None
        self._turns = WriterTurns(self.path, busy_timeout)
        self._file_sync = FileSync(self.path)
        self._read_lock: asyncio.Lock | None = None
        self._checkpoint_due: asyncio.Event | None = None
        self._checkpointer: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._wal_long = False  # set by the checkpointer, cleared after the next commit
        self._since_checkpoint = 0  # items written since the last checkpoint
        self._open = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def open(self) -> None:
        if self._open:
            return
        self._read_lock = asyncio.Lock()
        self._checkpoint_due = asyncio.Event()
        self._adds = GroupCommit(self._write_adds, max_batch=self.max_batch)
        try:
            await asyncio.to_thread(self.path.parent.mkdir, parents=True, exist_ok=True)
            await self._refuse_early()  # a newer release's inbox: before anything writes (.migrate)
            self._turns.open()
            if self.check:
                await check_inbox(self.path, self._turns, busy_timeout=self.busy_timeout)
            async with self._turns:  # processes starting together switch to WAL and migrate in turn
                self._intake = await self._open_intake()
            self._work = await self._connect()
            self._read = await self._connect(query_only=True)
        except _DB_ERRORS as exc:
            await self._close_connections()
            raise _unavailable(exc, self.path) from exc
        except BaseException:
            await self._close_connections()
            raise
        self._checkpointer = asyncio.get_running_loop().create_task(
            self._checkpointer_main(), name="sqlite-store-checkpointer"
        )
        self._open = True

    async def close(self) -> None:
        if not self._open:
            return
        self._open = False
        # Everything submitted before is still written and answered.
        if self._adds is not None:
            await self._adds.drain()
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        checkpointer, self._checkpointer = self._checkpointer, None
        if checkpointer is not None:
            checkpointer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checkpointer
        await self._close_connections()

    async def _close_connections(self) -> None:
        for name in ("_intake", "_work", "_progress", "_read"):
            await self._drop(name)
        self._turns.close()

    async def _drop_after_fault(self, name: str, exc: BaseException) -> None:
        """After a fault on connection ``name`` (its transaction rolled back): drop it, to be
        reopened by the next job, unless the fault was only another process holding the lock,
        which leaves it sound (reopening the intake connection also truncates the WAL, which
        would wait for that lock a second time)."""
        if not _is_busy(exc):
            await self._drop(name)

    async def _drop(self, name: str) -> None:
        conn = getattr(self, name)
        setattr(self, name, None)
        if conn is not None:
            await _close_quietly(conn)

    async def _connect(
        self, *, query_only: bool = False, sync: str | None = None
    ) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(
            self.path,
            timeout=self.busy_timeout,
            isolation_level=None,
            # A group's multi-row INSERTs (events, deliveries, job outcomes) have one text per
            # row count: room for all of them, so none is prepared again under load.
            cached_statements=3 * ROWS_PER_STATEMENT,
        )
        try:
            await conn.execute(PRAGMA_FOREIGN_KEYS)
            await conn.execute(sync or self._sync)
            await conn.execute(PRAGMA_JOURNAL_SIZE_LIMIT)
            ((mode,),) = await conn.execute_fetchall(PRAGMA_JOURNAL_MODE)
            # Switching needs a write; skip it when the file is already WAL (read-only files).
            if str(mode).lower() != "wal":
                # A new file: free pages can be given back (.space); it must be said before
                # the first page is written (an older file ignores it until a VACUUM).
                await conn.execute(PRAGMA_AUTO_VACUUM_INCREMENTAL)
                await conn.execute(PRAGMA_WAL)
            if query_only:
                await conn.execute(PRAGMA_QUERY_ONLY)
        except BaseException:
            await _close_quietly(conn)
            raise
        return conn

    async def _open_intake(self) -> aiosqlite.Connection:
        conn = await self._connect()
        try:
            await conn.execute(PRAGMA_NO_AUTOCHECKPOINT)
            await self._migrate(conn)  # a migration's statements may touch every page: not yet
            await conn.execute(PRAGMA_TEMP_STORE_MEMORY)
        except BaseException:
            await _close_quietly(conn)
            raise
        return conn

    # -- transactions ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if not self._open:
            raise StoreUnavailable("the inbox is not open")

    async def _transaction(
        self, conn: aiosqlite.Connection, body: Callable[[aiosqlite.Connection], Awaitable[T]]
    ) -> T:
        await conn.execute(BEGIN_WRITE)
        try:
            value = await body(conn)
            await conn.execute(COMMIT)
        except BaseException:
            with contextlib.suppress(sqlite3.Error, ValueError):
                await conn.execute(ROLLBACK)
            raise
        self.commit_count += 1
        return value

    async def _detached(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a transaction to its end even when the caller is cancelled meanwhile (a
        transaction left open on a shared connection would take the next caller's statements)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._forget)
        return await asyncio.shield(task)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a caller that went away is not an unhandled error

    async def _write_adds(self, adds: list[_Add]) -> list[bool | BaseException]:
        """One group of events: one transaction, new ids inserted, each told if it was new."""
        async with self._turns:
            try:
                if self._intake is None:  # reopened after a fault
                    self._intake = await self._open_intake()
                    await self._truncate_wal(self._intake)
                conn = self._intake
                results = await write_group(conn, adds, self.path)
                self.commit_count += 1
            except _DB_ERRORS as exc:
                await self._drop_after_fault("_intake", exc)
                return [_unavailable(exc, self.path) for _ in adds]
            if self._wal_long:
                # The background checkpoint copied most of a long WAL; finishing it here, between
                # two groups, lets the WAL restart even if the load never pauses.
                self._wal_long = False
                with contextlib.suppress(sqlite3.Error):
                    await conn.execute_fetchall(CHECKPOINT)
        self._since_checkpoint += len(adds)
        if self._since_checkpoint >= CHECKPOINT_EVERY_ITEMS and self._checkpoint_due is not None:
            self._checkpoint_due.set()
        return results

    async def _write_tx(
        self,
        fn: Callable[[aiosqlite.Connection], Awaitable[T]],
        *,
        durable: bool = True,
        own_transaction: bool = False,
    ) -> T:
        """Run ``fn`` in a write transaction of its own on the work connection, or, when not
        ``durable``, the progress connection (see the class); with ``own_transaction``, ``fn``
        begins and ends the transaction itself (a script)."""
        self._check_open()
        name = "_work" if durable or self._sync == PRAGMA_SYNC_NORMAL else "_progress"
        return await self._detached(self._write_job(fn, name, own_transaction))

    async def _write_job(
        self, fn: Callable[[aiosqlite.Connection], Awaitable[T]], name: str, own: bool
    ) -> T:
        async with self._turns:
            try:
                conn = getattr(self, name)
                if conn is None:
                    sync = PRAGMA_SYNC_NORMAL if name == "_progress" else None
                    conn = await self._connect(sync=sync)
                    setattr(self, name, conn)
                return await fn(conn) if own else await self._transaction(conn, fn)
            except _ITEM_ERRORS as exc:
                raise _unavailable(exc, self.path) from exc
            except _DB_ERRORS as exc:
                await self._drop_after_fault(name, exc)
                raise _unavailable(exc, self.path) from exc

    async def _read_tx(self, fn: Callable[[aiosqlite.Connection], Awaitable[T]]) -> T:
        """Run ``fn`` on the read connection inside one snapshot."""
        self._check_open()
        return await self._detached(self._read_job(fn))

    async def _read_job(self, fn: Callable[[aiosqlite.Connection], Awaitable[T]]) -> T:
        assert self._read_lock is not None
        async with self._read_lock:
            try:
                if self._read is None:
                    self._read = await self._connect(query_only=True)
                conn = self._read
                await conn.execute(BEGIN_READ)
                try:
                    return await fn(conn)
                finally:
                    with contextlib.suppress(sqlite3.Error):
                        await conn.execute(COMMIT)
            except _DB_ERRORS as exc:
                await self._drop_after_fault("_read", exc)
                raise _unavailable(exc, self.path) from exc

    async def _run_read(self, fn: Callable[[Conn], Awaitable[T]], *, snapshot: bool = False) -> T:
        """A flow's read (always one snapshot here)."""
        return await self._read_tx(lambda conn: run_flow(conn, fn))

    async def _run_write(
        self, fn: Callable[[Conn], Awaitable[T]], *, transaction: bool = True, durable: bool = True
    ) -> T:
        """A flow's write (always a transaction of its own here: one writer at a time)."""
        return await self._write_tx(lambda conn: run_flow(conn, fn), durable=durable)

    # -- the Store interface --------------------------------------------------------------------

    async def ping(self) -> None:
        await self._read_tx(lambda conn: conn.execute_fetchall(PING))

    async def add_event(self, event: NewEvent) -> bool:
        self._check_open()
        assert self._adds is not None
        # The row is built here, in the caller's task, so a bad value fails only this caller.
        row, sinks = rules.new_event_row(event)
        received = event.received_at
        deliveries = [(event.id, sink, received, received) for sink in sinks]
        key = outcome_key(event.event, event.job_id)
        outcome = None if key is None else (key, event.id, event.source, received)
        return await self._adds.submit(_Add(row, deliveries, outcome))

    def on_new_events(self, callback: Callable[[], None]) -> None:
        """Nothing to do: SQLite cannot tell this process about other processes' writes."""
