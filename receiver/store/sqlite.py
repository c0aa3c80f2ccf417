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
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import sqlite3
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from receiver.config import StoreSettings
from receiver.errors import ConfigError, StoreUnavailable, UnknownEvent
from receiver.store.base import (
    EVENT_COLUMNS,
    EVENT_STATES,
    Claim,
    EventRecord,
    NewEvent,
    Outcome,
    event_records,
)
from receiver.store.batching import GroupCommit

T = TypeVar("T")

SQLITE_PREFIX = "sqlite:///"

# -- schema -------------------------------------------------------------------------------------

CREATE_EVENTS = """
CREATE TABLE events (
    id               TEXT PRIMARY KEY,
    event            TEXT NOT NULL,
    job_id           TEXT NOT NULL,
    body             BLOB NOT NULL,
    headers          TEXT NOT NULL,
    received_at      REAL NOT NULL,
    state            TEXT NOT NULL,
    next_attempt_at  REAL,
    lease_owner      TEXT,
    lease_expires_at REAL
)
"""

CREATE_DELIVERIES = """
CREATE TABLE deliveries (
    event_id        TEXT NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    sink            TEXT NOT NULL,
    state           TEXT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL,
    last_error      TEXT,
    updated_at      REAL NOT NULL,
    PRIMARY KEY (event_id, sink)
) WITHOUT ROWID
"""

# claim: a range scan in next_attempt_at order over pending rows, however large the inbox grows.
CREATE_INDEX_DUE = "CREATE INDEX events_due ON events (state, next_attempt_at)"
# prune (state = 'done', received_at < ?), list by state, counts, oldest pending.
CREATE_INDEX_STATE_RECEIVED = "CREATE INDEX events_state_received ON events (state, received_at)"
CREATE_INDEX_RECEIVED = "CREATE INDEX events_received ON events (received_at)"
# redeliver_dead without scanning every delivery; dead rows are few.
CREATE_INDEX_DEAD = "CREATE INDEX deliveries_dead ON deliveries (event_id) WHERE state = 'dead'"

SCHEMA_V1: tuple[str, ...] = (
    CREATE_EVENTS,
    CREATE_DELIVERIES,
    CREATE_INDEX_DUE,
    CREATE_INDEX_STATE_RECEIVED,
    CREATE_INDEX_RECEIVED,
    CREATE_INDEX_DEAD,
    "PRAGMA user_version = 1",
)

# Migration N (1-based) brings the schema from version N-1 to N; each sets its own user_version.
MIGRATIONS: tuple[tuple[str, ...], ...] = (SCHEMA_V1,)
SCHEMA_VERSION = len(MIGRATIONS)

PRAGMA_FOREIGN_KEYS = "PRAGMA foreign_keys = ON"
PRAGMA_SYNC_FULL = "PRAGMA synchronous = FULL"
PRAGMA_SYNC_NORMAL = "PRAGMA synchronous = NORMAL"
PRAGMA_JOURNAL_MODE = "PRAGMA journal_mode"
PRAGMA_WAL = "PRAGMA journal_mode = WAL"
PRAGMA_QUERY_ONLY = "PRAGMA query_only = ON"
# Checkpoints reset the WAL, but it keeps its size; cap what stays on disk after a burst.
PRAGMA_JOURNAL_SIZE_LIMIT = "PRAGMA journal_size_limit = 67108864"
PRAGMA_USER_VERSION = "PRAGMA user_version"
# Commits never checkpoint inline (a checkpoint copies the WAL into the database file and fsyncs
# it: milliseconds a commit, and every request waiting on it, would otherwise wait for).
PRAGMA_NO_AUTOCHECKPOINT = "PRAGMA wal_autocheckpoint = 0"
CHECKPOINT = "PRAGMA wal_checkpoint(PASSIVE)"
PRAGMA_SETTINGS = """
SELECT
    (SELECT journal_mode FROM pragma_journal_mode),
    (SELECT synchronous FROM pragma_synchronous),
    (SELECT foreign_keys FROM pragma_foreign_keys),
    (SELECT timeout FROM pragma_busy_timeout),
    (SELECT user_version FROM pragma_user_version)
"""

BEGIN_WRITE = "BEGIN IMMEDIATE"
BEGIN_READ = "BEGIN"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
# Each job of a group runs inside its own savepoint: a job that fails alone is undone alone.
SAVEPOINT = "SAVEPOINT item"
RELEASE_SAVEPOINT = "RELEASE item"
ROLLBACK_SAVEPOINT = "ROLLBACK TO item"

# -- statements ---------------------------------------------------------------------------------

# Lists of ids travel as one JSON array parameter, so every statement stays a fixed string.
SELECT_EXISTING_IDS = "SELECT id FROM events WHERE id IN (SELECT value FROM json_each(?))"

INSERT_EVENT = """
INSERT INTO events (id, event, job_id, body, headers, received_at, state, next_attempt_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
"""

INSERT_DELIVERY = """
INSERT INTO deliveries (event_id, sink, state, attempts, next_attempt_at, last_error, updated_at)
VALUES (?, ?, 'pending', 0, ?, NULL, ?)
"""

# A group of events goes in with one multi-row INSERT per table (see _rows_statement): one
# statement step for the whole group instead of one per row, each of which would hand the GIL
# back and forth with the event loop.
INSERT_EVENTS_HEAD = """
INSERT INTO events (id, event, job_id, body, headers, received_at, state, next_attempt_at)
VALUES """
EVENT_ROW = "(?, ?, ?, ?, ?, ?, ?, ?)"
INSERT_DELIVERIES_HEAD = """
INSERT INTO deliveries (event_id, sink, state, attempts, next_attempt_at, last_error, updated_at)
VALUES """
DELIVERY_ROW = "(?, ?, 'pending', 0, ?, NULL, ?)"
# 8 parameters a row: well under SQLite's 32766 parameters a statement.
ROWS_PER_STATEMENT = 256

# Checkpoints run on their own connection, once this many events and jobs were written since the
# last one, or at least every CHECKPOINT_INTERVAL_SECONDS when anything was: each checkpoint
# ends with an fsync of the database file, which every other fsync on the disk waits behind.
CHECKPOINT_EVERY_ITEMS = 500
CHECKPOINT_INTERVAL_SECONDS = 1.0
CHECKPOINT_RETRY_SECONDS = 0.05
# A WAL that a background checkpoint found this long (pages, ~64 MB) is finished off by the
# writer between two groups: under constant load the WAL would otherwise never restart.
WAL_RESTART_PAGES = 16000


CLAIM = """
UPDATE events SET lease_owner = :owner, lease_expires_at = :expires
WHERE id IN (
    SELECT id FROM events
    WHERE state = 'pending' AND next_attempt_at <= :now
      AND (lease_expires_at IS NULL OR lease_expires_at < :now)
    ORDER BY next_attempt_at
    LIMIT :limit
)
RETURNING id, event, job_id, body, headers, received_at, state, next_attempt_at, rowid
"""

EXTEND_LEASE = """
UPDATE events SET lease_expires_at = ?
WHERE id IN (SELECT value FROM json_each(?)) AND lease_owner = ?
"""

RELEASE = """
UPDATE events SET lease_owner = NULL, lease_expires_at = NULL
WHERE id IN (SELECT value FROM json_each(?)) AND lease_owner = ?
"""

SETTLE = """
UPDATE deliveries
SET state = ?, attempts = attempts + ?, next_attempt_at = ?, last_error = ?, updated_at = ?
WHERE event_id = ? AND sink = ?
"""

# An event's state and next attempt follow from its deliveries (see receiver.store.base).
RECOMPUTE_EVENTS = """
UPDATE events SET
    state = CASE
        WHEN EXISTS (SELECT 1 FROM deliveries d
                     WHERE d.event_id = events.id AND d.state = 'pending') THEN 'pending'
        WHEN EXISTS (SELECT 1 FROM deliveries d
                     WHERE d.event_id = events.id AND d.state = 'dead') THEN 'dead'
        ELSE 'done'
    END,
    next_attempt_at = (SELECT min(d.next_attempt_at) FROM deliveries d
                       WHERE d.event_id = events.id AND d.state = 'pending')
WHERE id IN (SELECT value FROM json_each(?))
"""

EVENT_EXISTS = "SELECT 1 FROM events WHERE id = ?"

REDELIVER = """
UPDATE deliveries
SET state = 'pending', attempts = 0, next_attempt_at = ?, last_error = NULL, updated_at = ?
WHERE event_id = ? AND state != 'skipped'
"""

REDELIVER_DEAD = """
UPDATE deliveries
SET state = 'pending', attempts = 0, next_attempt_at = ?, last_error = NULL, updated_at = ?
WHERE state = 'dead'
RETURNING event_id
"""

# Deliveries go with their event (ON DELETE CASCADE).
PRUNE_BATCH = """
DELETE FROM events WHERE id IN (
    SELECT id FROM events WHERE state = 'done' AND received_at < ? LIMIT ?
)
"""

SELECT_EVENT = "SELECT " + EVENT_COLUMNS + " FROM events WHERE id = ?"

LIST_ALL = (
    "SELECT " + EVENT_COLUMNS + " FROM events "
    "ORDER BY received_at DESC, rowid DESC LIMIT ? OFFSET ?"
)

LIST_BY_STATE = (
    "SELECT " + EVENT_COLUMNS + " FROM events WHERE state = ? "
    "ORDER BY received_at DESC, rowid DESC LIMIT ? OFFSET ?"
)

SELECT_DELIVERIES = """
SELECT event_id, sink, state, attempts, next_attempt_at, last_error, updated_at
FROM deliveries WHERE event_id IN (SELECT value FROM json_each(?))
ORDER BY event_id, sink
"""

COUNTS = """
SELECT
    (SELECT count(*) FROM events WHERE state = 'pending'),
    (SELECT count(*) FROM events WHERE state = 'done'),
    (SELECT count(*) FROM events WHERE state = 'dead'),
    (SELECT min(received_at) FROM events WHERE state = 'pending')
"""

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


def _unavailable(exc: BaseException, path: Path) -> StoreUnavailable:
    """A short, driver-free message for what went wrong with the database file."""
    name = str(getattr(exc, "sqlite_errorname", ""))
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        message = f"the inbox database {path} is locked by another writer"
    elif name.startswith("SQLITE_READONLY"):
        message = f"the inbox database {path} is read-only"
    elif name == "SQLITE_FULL":
        message = f"the disk holding the inbox database {path} is full"
    elif name.startswith("SQLITE_CANTOPEN"):
        message = f"the inbox database {path} cannot be opened"
    elif name.startswith("SQLITE_IOERR"):
        message = f"disk I/O error on the inbox database {path}"
    elif name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        message = f"the inbox database {path} is corrupt or not a SQLite database"
    elif isinstance(exc, OSError):
        message = f"cannot create the directory for the inbox database {path}: {exc.strerror}"
    else:
        message = f"the inbox database {path} failed: {exc}"
    err = StoreUnavailable(message)
    err.__cause__ = exc
    return err


# Errors that mean "the database file is not usable right now", never a bug in this module.
# Errors that mean "the database file is not usable right now", never a bug in this module.
_DB_ERRORS = (sqlite3.Error, OSError)
# Errors that come from one statement's arguments, not from the file: they fail only the event
# (or job) that caused them. A str with a lone surrogate cannot be encoded for SQLite at all.
_ITEM_ERRORS = (
    sqlite3.IntegrityError,
    sqlite3.ProgrammingError,
    sqlite3.InterfaceError,
    sqlite3.DataError,
    sqlite3.NotSupportedError,
    UnicodeEncodeError,
)


@functools.lru_cache(maxsize=2 * ROWS_PER_STATEMENT)
def _rows_statement(head: str, row: str, count: int) -> str:
    """``head`` followed by ``count`` placeholder tuples (placeholders only, never values)."""
    return head + ", ".join([row] * count)


async def _insert_rows(
    conn: aiosqlite.Connection, head: str, row: str, rows: Sequence[tuple[Any, ...]]
) -> None:
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[start : start + ROWS_PER_STATEMENT]
        params = [value for values in chunk for value in values]
        await conn.execute(_rows_statement(head, row, len(chunk)), params)


@dataclass(slots=True)
class _Add:
    row: tuple[Any, ...]
    deliveries: list[tuple[Any, ...]]

    @property
    def id(self) -> str:
        return str(self.row[0])


class SqliteStore:
    """The inbox in one SQLite file (WAL), on three aiosqlite connections.

    - *intake*: :meth:`add_event` calls are gathered by a
      :class:`~receiver.store.batching.GroupCommit` and written as one transaction, with one
      multi-row INSERT per table and one commit (one fsync) for the whole group.
    - *work*: claims, settles, leases, redeliveries and prunes, each its own short transaction.
    - *read*: query-only snapshots for get, list and counts (WAL readers never wait for writers).

    Write transactions of this process take turns on one lock, so the process never waits on
    SQLite's busy handler for itself; ``busy_timeout`` is how long a write waits for another
    process's lock before raising StoreUnavailable. Checkpoints (copying the WAL back into the
    database file, and its fsync) run on a fourth connection, off the commit path.

    ``path`` overrides the file named by ``settings.url``; ``max_batch`` caps the events written
    per transaction. :attr:`commit_count` counts committed write transactions.

    Any sqlite3 error that means the file is unusable (locked, read-only, full, I/O error,
    corrupt) becomes :class:`~receiver.errors.StoreUnavailable` for the callers of that
    transaction and drops the connection; the next transaction reconnects, so the store heals
    once the fault clears.
    """

    def __init__(
        self,
        settings: StoreSettings,
        *,
        path: str | Path | None = None,
        busy_timeout: float = 5.0,
        max_batch: int = 1000,
    ) -> None:
        self.settings = settings
        self.path = Path(path) if path is not None else sqlite_path(settings.url)
        self.busy_timeout = busy_timeout
        self.max_batch = max(1, max_batch)
        self.commit_count = 0
        self._sync = PRAGMA_SYNC_NORMAL if settings.synchronous == "normal" else PRAGMA_SYNC_FULL
        self._intake: aiosqlite.Connection | None = None
        self._work: aiosqlite.Connection | None = None
        self._read: aiosqlite.Connection | None = None
        # Loop-bound objects are made in open(): a store may be reopened on another event loop.
        self._adds: GroupCommit[_Add, bool] | None = None
        self._write_lock: asyncio.Lock | None = None
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
        self._write_lock = asyncio.Lock()
        self._read_lock = asyncio.Lock()
        self._checkpoint_due = asyncio.Event()
        self._adds = GroupCommit(self._write_adds, max_batch=self.max_batch)
        try:
            await asyncio.to_thread(self.path.parent.mkdir, parents=True, exist_ok=True)
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
        for name in ("_intake", "_work", "_read"):
            await self._drop(name)

    async def _drop(self, name: str) -> None:
        conn = getattr(self, name)
        setattr(self, name, None)
        if conn is not None:
            await _close_quietly(conn)

    async def _connect(self, *, query_only: bool = False) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(
            self.path,
            timeout=self.busy_timeout,
            isolation_level=None,
            cached_statements=2 * ROWS_PER_STATEMENT,
        )
        try:
            await conn.execute(PRAGMA_FOREIGN_KEYS)
            await conn.execute(self._sync)
            await conn.execute(PRAGMA_JOURNAL_SIZE_LIMIT)
            ((mode,),) = await conn.execute_fetchall(PRAGMA_JOURNAL_MODE)
            # Switching needs a write; skip it when the file is already WAL (read-only files).
            if str(mode).lower() != "wal":
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
            await self._migrate(conn)
        except BaseException:
            await _close_quietly(conn)
            raise
        return conn

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
        assert self._write_lock is not None
        async with self._write_lock:
            try:
                if self._intake is None:
                    self._intake = await self._open_intake()
                conn = self._intake
                try:
                    results: list[bool | BaseException] = list(
                        await self._transaction(conn, functools.partial(_insert_new, adds=adds))
                    )
                except _ITEM_ERRORS:
                    # One event's values are unacceptable: write them one by one so only it fails.
                    results = await self._transaction(conn, self._insert_each(adds))
            except _DB_ERRORS as exc:
                await self._drop("_intake")
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

    def _insert_each(
        self, adds: list[_Add]
    ) -> Callable[[aiosqlite.Connection], Awaitable[list[bool | BaseException]]]:
        async def run(conn: aiosqlite.Connection) -> list[bool | BaseException]:
            results: list[bool | BaseException] = []
            for add in adds:
                await conn.execute(SAVEPOINT)
                try:
                    results += await _insert_new(conn, [add])
                except _ITEM_ERRORS as exc:
                    await conn.execute(ROLLBACK_SAVEPOINT)
                    results.append(_unavailable(exc, self.path))
                await conn.execute(RELEASE_SAVEPOINT)
            return results

        return run

    async def _write_tx(self, fn: Callable[[aiosqlite.Connection], Awaitable[T]]) -> T:
        """Run ``fn`` in a write transaction of its own on the work connection."""
        self._check_open()
        return await self._detached(self._write_job(fn))

    async def _write_job(self, fn: Callable[[aiosqlite.Connection], Awaitable[T]]) -> T:
        assert self._write_lock is not None
        async with self._write_lock:
            try:
                if self._work is None:
                    self._work = await self._connect()
                return await self._transaction(self._work, fn)
            except _ITEM_ERRORS as exc:
                raise _unavailable(exc, self.path) from exc
            except _DB_ERRORS as exc:
                await self._drop("_work")
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
                await self._drop("_read")
                raise _unavailable(exc, self.path) from exc

    # -- checkpoints ----------------------------------------------------------------------------

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
                self._wal_long = wal_pages >= WAL_RESTART_PAGES
                if copied < wal_pages and self._since_checkpoint:
                    # Behind a busy writer: go again soon, without waiting for the next batch.
                    await asyncio.sleep(CHECKPOINT_RETRY_SECONDS)
                    due.set()
        finally:
            if conn is not None:
                await asyncio.shield(_close_quietly(conn))

    async def pragmas(self) -> dict[str, Any]:
        """The settings in force on the intake connection (journal mode, synchronous, ...)."""
        self._check_open()
        assert self._write_lock is not None
        async with self._write_lock:
            if self._intake is None:
                raise StoreUnavailable("the inbox intake connection is down")
            ((journal, sync, fks, busy, version),) = await self._intake.execute_fetchall(
                PRAGMA_SETTINGS
            )
        return {
            "journal_mode": str(journal).lower(),
            "synchronous": {0: "off", 1: "normal", 2: "full", 3: "extra"}.get(sync, sync),
            "foreign_keys": bool(fks),
            "busy_timeout_ms": busy,
            "user_version": version,
        }

    # -- the Store interface --------------------------------------------------------------------

    async def ping(self) -> None:
        await self._read_tx(lambda conn: conn.execute_fetchall(PING))

    async def add_event(self, event: NewEvent) -> bool:
        self._check_open()
        assert self._adds is not None
        # The row is built here, in the caller's task, so a bad value fails only this caller.
        sinks = tuple(dict.fromkeys(event.sinks))
        received = event.received_at
        row = (
            event.id,
            event.event,
            event.job_id,
            event.body,
            _HEADERS_JSON.encode(dict(event.headers)),
            received,
            "pending" if sinks else "done",
            received if sinks else None,
        )
        deliveries = [(event.id, sink, received, received) for sink in sinks]
        return await self._adds.submit(_Add(row, deliveries))

    async def claim(
        self, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> list[Claim]:
        if limit <= 0:
            return []
        params = {"owner": owner, "expires": now + lease_seconds, "now": now, "limit": limit}

        async def run(conn: aiosqlite.Connection) -> list[Claim]:
            rows = list(await conn.execute_fetchall(CLAIM, params))
            if not rows:
                return []
            rows.sort(key=lambda r: (r[7], r[8]))
            events = await _with_deliveries(conn, rows)
            return [
                Claim(
                    event=ev,
                    due=tuple(
                        d
                        for d in ev.deliveries
                        if d.state == "pending"
                        and d.next_attempt_at is not None
                        and d.next_attempt_at <= now
                    ),
                    owner=owner,
                )
                for ev in events
            ]

        return await self._write_tx(run)

    async def extend_lease(
        self, event_ids: list[str], *, owner: str, lease_seconds: float, now: float
    ) -> None:
        if not event_ids:
            return
        params = (now + lease_seconds, json.dumps(list(event_ids)), owner)
        await self._write_tx(lambda conn: conn.execute(EXTEND_LEASE, params))

    async def release(self, event_ids: list[str], *, owner: str) -> None:
        if not event_ids:
            return
        params = (json.dumps(list(event_ids)), owner)
        await self._write_tx(lambda conn: conn.execute(RELEASE, params))

    async def settle(self, event_id: str, sink: str, outcome: Outcome, *, now: float) -> None:
        if outcome.state == "pending":
            nxt: float | None = now if outcome.next_attempt_at is None else outcome.next_attempt_at
        else:
            nxt = None
        error = None if outcome.state == "done" else outcome.error
        params = (outcome.state, int(outcome.attempted), nxt, error, now, event_id, sink)

        async def run(conn: aiosqlite.Connection) -> None:
            if (await conn.execute(SETTLE, params)).rowcount == 0:
                raise UnknownEvent(f"no delivery {sink!r} for event {event_id!r}")
            await conn.execute(RECOMPUTE_EVENTS, (json.dumps([event_id]),))

        await self._write_tx(run)

    async def get(self, event_id: str) -> EventRecord | None:
        async def run(conn: aiosqlite.Connection) -> EventRecord | None:
            rows = list(await conn.execute_fetchall(SELECT_EVENT, (event_id,)))
            if not rows:
                return None
            return (await _with_deliveries(conn, rows))[0]

        return await self._read_tx(run)

    async def list(
        self, *, state: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[EventRecord]:
        limit, offset = max(limit, 0), max(offset, 0)

        async def run(conn: aiosqlite.Connection) -> list[EventRecord]:
            if state is None:
                rows = await conn.execute_fetchall(LIST_ALL, (limit, offset))
            else:
                rows = await conn.execute_fetchall(LIST_BY_STATE, (state, limit, offset))
            return await _with_deliveries(conn, list(rows))

        return await self._read_tx(run)

    async def redeliver(self, event_id: str, *, now: float) -> int:
        async def run(conn: aiosqlite.Connection) -> int:
            if not await conn.execute_fetchall(EVENT_EXISTS, (event_id,)):
                raise UnknownEvent(f"no event {event_id!r} in the inbox")
            count = (await conn.execute(REDELIVER, (now, now, event_id))).rowcount
            await conn.execute(RECOMPUTE_EVENTS, (json.dumps([event_id]),))
            return int(count)

        return await self._write_tx(run)

    async def redeliver_dead(self, *, now: float) -> int:
        async def run(conn: aiosqlite.Connection) -> int:
            rows = list(await conn.execute_fetchall(REDELIVER_DEAD, (now, now)))
            if rows:
                ids = json.dumps(list({row[0] for row in rows}))
                await conn.execute(RECOMPUTE_EVENTS, (ids,))
            return len(rows)

        return await self._write_tx(run)

    async def prune(self, *, older_than: float, batch: int = 1000) -> int:
        batch = max(batch, 1)

        async def run(conn: aiosqlite.Connection) -> int:
            return int((await conn.execute(PRUNE_BATCH, (older_than, batch))).rowcount)

        total = 0
        # One short transaction per batch, so intake keeps committing in between.
        while True:
            deleted = await self._write_tx(run)
            total += deleted
            if deleted < batch:
                return total

    async def counts(self) -> tuple[dict[str, int], float | None]:
        async def run(conn: aiosqlite.Connection) -> tuple[dict[str, int], float | None]:
            (row,) = await conn.execute_fetchall(COUNTS)
            counts: dict[str, int] = {state: int(row[i]) for i, state in enumerate(EVENT_STATES)}
            return counts, row[3]

        return await self._read_tx(run)

    def on_new_events(self, callback: Callable[[], None]) -> None:
        """Nothing to do: SQLite cannot tell this process about other processes' writes."""


# Compact, and one encoder for every event: json.dumps() with options builds a new one per call.
_HEADERS_JSON = json.JSONEncoder(separators=(",", ":"))


async def _close_quietly(conn: aiosqlite.Connection) -> None:
    with contextlib.suppress(sqlite3.Error, ValueError):
        await conn.close()


async def _user_version(conn: aiosqlite.Connection) -> int:
    ((version,),) = await conn.execute_fetchall(PRAGMA_USER_VERSION)
    return int(version)


async def _insert_new(conn: aiosqlite.Connection, adds: list[_Add]) -> list[bool]:
    """Insert the events whose id is not stored yet; for each add, whether it was new."""
    ids = json.dumps([add.id for add in adds])
    seen = {row[0] for row in await conn.execute_fetchall(SELECT_EXISTING_IDS, (ids,))}
    fresh: list[_Add] = []
    results: list[bool] = []
    for add in adds:
        is_new = add.id not in seen
        results.append(is_new)
        if is_new:
            seen.add(add.id)
            fresh.append(add)
    if fresh:
        await _insert_rows(conn, INSERT_EVENTS_HEAD, EVENT_ROW, [add.row for add in fresh])
        deliveries = [row for add in fresh for row in add.deliveries]
        if deliveries:
            await _insert_rows(conn, INSERT_DELIVERIES_HEAD, DELIVERY_ROW, deliveries)
    return results


async def _with_deliveries(
    conn: aiosqlite.Connection, rows: Sequence[Sequence[Any]]
) -> list[EventRecord]:
    """EventRecords for event rows (``EVENT_COLUMNS`` first), with their deliveries by sink."""
    if not rows:
        return []
    ids = json.dumps([row[0] for row in rows])
    return event_records(rows, await conn.execute_fetchall(SELECT_DELIVERIES, (ids,)))
