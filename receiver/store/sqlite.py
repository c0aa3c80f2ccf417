"""The SQLite inbox: WAL mode, one writer thread with group commit, a separate reader thread.

Every write goes through one thread that owns the write connection, so the process never contends
with itself for SQLite's single write lock. Concurrent :meth:`SqliteStore.add_event` calls, and
the workers' claims and settles, are queued and written together: whatever is waiting when the
writer comes round goes into one transaction with one fsync, and each caller is answered only
after that commit. The event loop only enqueues and is woken once per group, so intake costs the
loop almost nothing beyond the request itself. Reads use their own connection on their own thread
(WAL readers never block the writer). Checkpoints (copying the WAL back into the database file,
and its fsync) run on a third thread, so a commit normally only appends to the WAL.

Any sqlite3 error that means the file is unusable (locked, read-only, full, I/O error, corrupt)
becomes :class:`~receiver.errors.StoreUnavailable` for the whole group and drops the connection
it happened on; the next group reconnects, so the store heals once the fault clears.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

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
from receiver.store.pull import admit, outcome_key
from receiver.store.sqlite_pull import INSERT_OUTCOME, SCHEMA_V2, SqlitePull, held_outcomes

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
MIGRATIONS: tuple[tuple[str, ...], ...] = (SCHEMA_V1, SCHEMA_V2)
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

# Checkpoints run on their own thread, once this many events and jobs were written since the
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
_DB_ERRORS = (sqlite3.Error, OSError)
# sqlite3 errors that come from one statement's arguments, not from the file: they fail only the
# job (or event) that caused them, and the rest of the group still commits.
_ITEM_ERRORS = (
    sqlite3.IntegrityError,
    sqlite3.ProgrammingError,
    sqlite3.InterfaceError,
    sqlite3.DataError,
    sqlite3.NotSupportedError,
)


def _is_item_error(exc: BaseException) -> bool:
    return isinstance(exc, _ITEM_ERRORS)


@functools.lru_cache(maxsize=2 * ROWS_PER_STATEMENT)
def _rows_statement(head: str, row: str, count: int) -> str:
    """``head`` followed by ``count`` placeholder tuples (placeholders only, never values)."""
    return head + ", ".join([row] * count)


def _insert_rows(
    conn: sqlite3.Connection, head: str, row: str, rows: Sequence[tuple[Any, ...]]
) -> None:
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[start : start + ROWS_PER_STATEMENT]
        params = [value for values in chunk for value in values]
        conn.execute(_rows_statement(head, row, len(chunk)), params)


@dataclass(slots=True)
class _Add:
    row: tuple[Any, ...]
    deliveries: list[tuple[Any, ...]]
    future: asyncio.Future[bool]
    # (key, event id, source, created at) for a job outcome event (see receiver.store.pull).
    outcome: tuple[str, str, str, float] | None = None

    @property
    def id(self) -> str:
        return str(self.row[0])


@dataclass(slots=True)
class _Job:
    fn: Callable[[sqlite3.Connection], Any]
    future: asyncio.Future[Any]


# (future, succeeded, result or exception), handed back to the event loop in one callback.
_Result = tuple["asyncio.Future[Any]", bool, Any]

_STOP = object()


def _settle_futures(results: list[_Result]) -> None:
    for future, ok, value in results:
        if future.done():  # the caller was cancelled
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


class SqliteStore(SqlitePull):
    """The inbox in one SQLite file (WAL), written by a single group-committing writer thread.

    ``path`` overrides the file named by ``settings.url``; ``busy_timeout`` is how long a write
    waits for another process's lock before raising StoreUnavailable; ``max_batch`` caps the
    items (events and jobs) written per transaction. :attr:`commit_count` counts committed write
    transactions (tests use it to see group commit at work).
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
        self._write: sqlite3.Connection | None = None  # only the writer thread uses it
        self._read: sqlite3.Connection | None = None  # only the reader thread uses it
        self._queue: queue.SimpleQueue[_Add | _Job | object] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._writer_done: asyncio.Future[None] | None = None
        self._reader: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._checkpointer: threading.Thread | None = None
        self._checkpoint_due = threading.Event()
        self._checkpoint_stop = False
        self._wal_long = False  # set by the checkpointer, cleared by the writer
        self._since_checkpoint = 0  # items written since the last checkpoint
        self._open = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def open(self) -> None:
        if self._open:
            return
        loop = asyncio.get_running_loop()
        reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store-reader")
        try:
            await asyncio.to_thread(self.path.parent.mkdir, parents=True, exist_ok=True)
            self._write = await asyncio.to_thread(self._open_write)
            await loop.run_in_executor(reader, self._read_conn)
        except _DB_ERRORS as exc:
            await self._close_connections(reader)
            raise _unavailable(exc, self.path) from exc
        except BaseException:
            await self._close_connections(reader)
            raise
        # Fresh per open: a store may be reopened on another event loop (tests do).
        self._loop = loop
        self._reader = reader
        self._queue = queue.SimpleQueue()
        self._writer_done = loop.create_future()
        self._writer = threading.Thread(
            target=self._writer_main, name="sqlite-store-writer", daemon=True
        )
        self._writer.start()
        self._checkpoint_due = threading.Event()
        self._checkpoint_stop = False
        self._checkpointer = threading.Thread(
            target=self._checkpointer_main, name="sqlite-store-checkpointer", daemon=True
        )
        self._checkpointer.start()
        self._open = True

    async def close(self) -> None:
        if not self._open:
            return
        self._open = False
        # Everything queued before the stop marker is still written and answered.
        self._queue.put(_STOP)
        if self._writer_done is not None:
            await asyncio.shield(self._writer_done)
        self._writer = None
        checkpointer, self._checkpointer = self._checkpointer, None
        if checkpointer is not None:
            self._checkpoint_stop = True
            self._checkpoint_due.set()
            await asyncio.to_thread(checkpointer.join)
        reader, self._reader = self._reader, None
        await self._close_connections(reader)

    async def _close_connections(self, reader: ThreadPoolExecutor | None) -> None:
        write, self._write = self._write, None
        if write is not None:
            await asyncio.to_thread(_close_quietly, write)
        if reader is not None:
            await asyncio.get_running_loop().run_in_executor(reader, self._drop_read)
            reader.shutdown(wait=False)

    def _connect(self) -> sqlite3.Connection:
        # check_same_thread=False: the write connection is opened by open() and then used only
        # by the writer thread; each connection is only ever used by one thread at a time.
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout,
            isolation_level=None,
            check_same_thread=False,
            cached_statements=2 * ROWS_PER_STATEMENT,
        )
        try:
            conn.execute(PRAGMA_FOREIGN_KEYS)
            conn.execute(self._sync)
            conn.execute(PRAGMA_JOURNAL_SIZE_LIMIT)
            (mode,) = conn.execute(PRAGMA_JOURNAL_MODE).fetchone()
            # Switching needs a write; skip it when the file is already WAL (read-only files).
            if str(mode).lower() != "wal":
                conn.execute(PRAGMA_WAL)
        except BaseException:
            _close_quietly(conn)
            raise
        return conn

    def _open_write(self) -> sqlite3.Connection:
        conn = self._connect()
        try:
            conn.execute(PRAGMA_NO_AUTOCHECKPOINT)
            self._migrate(conn)
        except BaseException:
            _close_quietly(conn)
            raise
        return conn

    def _read_conn(self) -> sqlite3.Connection:
        if self._read is None:
            conn = self._connect()
            conn.execute(PRAGMA_QUERY_ONLY)
            self._read = conn
        return self._read

    def _drop_read(self) -> None:
        conn, self._read = self._read, None
        if conn is not None:
            _close_quietly(conn)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        version = _user_version(conn)
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
        conn.execute(BEGIN_WRITE)
        try:
            # Read again under the write lock: another process may have migrated meanwhile.
            version = _user_version(conn)
            for statements in MIGRATIONS[version:]:
                for statement in statements:
                    conn.execute(statement)
            conn.execute(COMMIT)
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute(ROLLBACK)
            raise

    # -- the writer -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if not self._open:
            raise StoreUnavailable("the inbox is not open")
        if self._writer is None or not self._writer.is_alive():
            raise StoreUnavailable("the inbox writer has stopped")

    def _submit(self, item: _Add | _Job) -> None:
        self._check_open()
        self._queue.put(item)

    def _writer_main(self) -> None:
        try:
            while True:
                items = [self._queue.get()]
                while len(items) < self.max_batch:
                    try:
                        items.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                work = [item for item in items if isinstance(item, _Add | _Job)]
                if work:
                    self._post(self._write_group(work))
                    self._after_commit(len(work))
                # close() enqueues _STOP after refusing new work, so nothing can follow it.
                if len(work) < len(items):
                    return
        finally:
            self._post_done()

    def _after_commit(self, items: int) -> None:
        """Wake the checkpointer when due; finish a long WAL's checkpoint so it can restart."""
        self._since_checkpoint += items
        if self._since_checkpoint >= CHECKPOINT_EVERY_ITEMS:
            self._checkpoint_due.set()
        if self._wal_long and self._write is not None:
            self._wal_long = False
            # The background checkpoint copied most of it: only the latest groups are left.
            with contextlib.suppress(sqlite3.Error):
                self._write.execute(CHECKPOINT).fetchall()

    def _checkpointer_main(self) -> None:
        """Copy committed WAL pages into the database file, off the commit path."""
        conn: sqlite3.Connection | None = None
        try:
            while True:
                self._checkpoint_due.wait(CHECKPOINT_INTERVAL_SECONDS)
                if self._checkpoint_stop:
                    return
                self._checkpoint_due.clear()
                if not self._since_checkpoint:
                    continue
                self._since_checkpoint = 0
                try:
                    if conn is None:
                        conn = self._connect()
                    _busy, wal_pages, copied = conn.execute(CHECKPOINT).fetchone()
                except _DB_ERRORS:
                    if conn is not None:
                        _close_quietly(conn)
                    conn = None  # the writer reports the fault; try again later
                    self._since_checkpoint += 1
                    continue
                self._wal_long = wal_pages >= WAL_RESTART_PAGES
                if copied < wal_pages and self._since_checkpoint:
                    # Behind a busy writer: go again soon, without waiting for the next batch.
                    time.sleep(CHECKPOINT_RETRY_SECONDS)
                    self._checkpoint_due.set()
        finally:
            if conn is not None:
                _close_quietly(conn)

    def _post(self, results: list[_Result]) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting
            self._loop.call_soon_threadsafe(_settle_futures, results)

    def _post_done(self) -> None:
        done = self._writer_done
        if self._loop is None or done is None:
            return

        def finish() -> None:
            if not done.done():
                done.set_result(None)

        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(finish)

    def _write_group(self, items: list[_Add | _Job]) -> list[_Result]:
        """Write every queued event and job in one transaction; the results once committed."""
        adds = [item for item in items if isinstance(item, _Add)]
        jobs = [item for item in items if isinstance(item, _Job)]
        try:
            if self._write is None:
                self._write = self._open_write()
            conn = self._write
            conn.execute(BEGIN_WRITE)
            try:
                results = self._insert_events(conn, adds) if adds else []
                results += [self._run_job(conn, job) for job in jobs]
                conn.execute(COMMIT)
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute(ROLLBACK)
                raise
        except _DB_ERRORS as exc:
            self._drop_write()
            return [(item.future, False, _unavailable(exc, self.path)) for item in items]
        except Exception as exc:  # a bug: fail the callers, keep the writer alive
            self._drop_write()
            return [(item.future, False, exc) for item in items]
        self.commit_count += 1
        return results

    def _drop_write(self) -> None:
        conn, self._write = self._write, None
        if conn is not None:
            _close_quietly(conn)

    def _insert_events(self, conn: sqlite3.Connection, adds: list[_Add]) -> list[_Result]:
        conn.execute(SAVEPOINT)
        try:
            results = _insert_new(conn, adds)
        except sqlite3.Error as exc:
            if not _is_item_error(exc):
                raise
            # One event's values are unacceptable: write them one by one so only it fails.
            conn.execute(ROLLBACK_SAVEPOINT)
            results = [self._run_job(conn, _Job(_single_insert(add), add.future)) for add in adds]
        conn.execute(RELEASE_SAVEPOINT)
        return results

    def _run_job(self, conn: sqlite3.Connection, job: _Job) -> _Result:
        conn.execute(SAVEPOINT)
        try:
            value = job.fn(conn)
        except Exception as exc:
            if isinstance(exc, _DB_ERRORS) and not _is_item_error(exc):
                raise  # the file is unusable: the whole group fails
            conn.execute(ROLLBACK_SAVEPOINT)
            conn.execute(RELEASE_SAVEPOINT)
            if isinstance(exc, sqlite3.Error):
                return (job.future, False, _unavailable(exc, self.path))
            return (job.future, False, exc)  # UnknownEvent, or a bug: the caller sees it
        conn.execute(RELEASE_SAVEPOINT)
        return (job.future, True, value)

    async def _write_tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` inside the next write transaction, on the writer thread."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._submit(_Job(fn, future))
        return await future

    async def _read_tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the read connection inside one snapshot, on the reader thread."""
        self._check_open()
        assert self._reader is not None
        return await asyncio.get_running_loop().run_in_executor(self._reader, self._read_sync, fn)

    def _read_sync(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            conn = self._read_conn()
            conn.execute(BEGIN_READ)
            try:
                return fn(conn)
            finally:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute(COMMIT)
        except _DB_ERRORS as exc:
            self._drop_read()
            raise _unavailable(exc, self.path) from exc

    async def pragmas(self) -> dict[str, Any]:
        """The settings in force on the write connection (journal mode, synchronous, ...)."""

        def run(conn: sqlite3.Connection) -> dict[str, Any]:
            journal, sync, fks, busy, version = conn.execute(PRAGMA_SETTINGS).fetchone()
            return {
                "journal_mode": str(journal).lower(),
                "synchronous": {0: "off", 1: "normal", 2: "full", 3: "extra"}.get(sync, sync),
                "foreign_keys": bool(fks),
                "busy_timeout_ms": busy,
                "user_version": version,
            }

        return await self._write_tx(run)

    # -- the Store interface --------------------------------------------------------------------

    async def ping(self) -> None:
        await self._read_tx(lambda conn: conn.execute(PING).fetchall())

    async def add_event(self, event: NewEvent) -> bool:
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
        key = outcome_key(event.event, event.job_id)
        outcome = None if key is None else (key, event.id, event.source, received)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._submit(_Add(row, deliveries, future, outcome))
        return await future

    async def claim(
        self, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> list[Claim]:
        if limit <= 0:
            return []
        params = {"owner": owner, "expires": now + lease_seconds, "now": now, "limit": limit}

        def run(conn: sqlite3.Connection) -> list[Claim]:
            rows = conn.execute(CLAIM, params).fetchall()
            if not rows:
                return []
            rows.sort(key=lambda r: (r[7], r[8]))
            events = _with_deliveries(conn, rows)
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
        await self._write_tx(lambda conn: conn.execute(EXTEND_LEASE, params).rowcount)

    async def release(self, event_ids: list[str], *, owner: str) -> None:
        if not event_ids:
            return
        params = (json.dumps(list(event_ids)), owner)
        await self._write_tx(lambda conn: conn.execute(RELEASE, params).rowcount)

    async def settle(self, event_id: str, sink: str, outcome: Outcome, *, now: float) -> None:
        if outcome.state == "pending":
            nxt: float | None = now if outcome.next_attempt_at is None else outcome.next_attempt_at
        else:
            nxt = None
        error = None if outcome.state == "done" else outcome.error
        params = (outcome.state, int(outcome.attempted), nxt, error, now, event_id, sink)

        def run(conn: sqlite3.Connection) -> None:
            if conn.execute(SETTLE, params).rowcount == 0:
                raise UnknownEvent(f"no delivery {sink!r} for event {event_id!r}")
            conn.execute(RECOMPUTE_EVENTS, (json.dumps([event_id]),))

        await self._write_tx(run)

    async def get(self, event_id: str) -> EventRecord | None:
        def run(conn: sqlite3.Connection) -> EventRecord | None:
            rows = conn.execute(SELECT_EVENT, (event_id,)).fetchall()
            if not rows:
                return None
            return _with_deliveries(conn, rows)[0]

        return await self._read_tx(run)

    async def list(
        self, *, state: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[EventRecord]:
        limit, offset = max(limit, 0), max(offset, 0)

        def run(conn: sqlite3.Connection) -> list[EventRecord]:
            if state is None:
                rows = conn.execute(LIST_ALL, (limit, offset)).fetchall()
            else:
                rows = conn.execute(LIST_BY_STATE, (state, limit, offset)).fetchall()
            return _with_deliveries(conn, rows)

        return await self._read_tx(run)

    async def redeliver(self, event_id: str, *, now: float) -> int:
        def run(conn: sqlite3.Connection) -> int:
            if not conn.execute(EVENT_EXISTS, (event_id,)).fetchall():
                raise UnknownEvent(f"no event {event_id!r} in the inbox")
            count = conn.execute(REDELIVER, (now, now, event_id)).rowcount
            conn.execute(RECOMPUTE_EVENTS, (json.dumps([event_id]),))
            return count

        return await self._write_tx(run)

    async def redeliver_dead(self, *, now: float) -> int:
        def run(conn: sqlite3.Connection) -> int:
            rows = conn.execute(REDELIVER_DEAD, (now, now)).fetchall()
            if rows:
                ids = json.dumps(list({row[0] for row in rows}))
                conn.execute(RECOMPUTE_EVENTS, (ids,))
            return len(rows)

        return await self._write_tx(run)

    async def prune(self, *, older_than: float, batch: int = 1000) -> int:
        batch = max(batch, 1)

        def run(conn: sqlite3.Connection) -> int:
            return conn.execute(PRUNE_BATCH, (older_than, batch)).rowcount

        total = 0
        # One short transaction per batch, so intake keeps committing in between.
        while True:
            deleted = await self._write_tx(run)
            total += deleted
            if deleted < batch:
                return total

    async def counts(self) -> tuple[dict[str, int], float | None]:
        def run(conn: sqlite3.Connection) -> tuple[dict[str, int], float | None]:
            row = conn.execute(COUNTS).fetchone()
            counts: dict[str, int] = {state: int(row[i]) for i, state in enumerate(EVENT_STATES)}
            return counts, row[3]

        return await self._read_tx(run)

    def on_new_events(self, callback: Callable[[], None]) -> None:
        """Nothing to do: SQLite cannot tell this process about other processes' writes."""


# Compact, and one encoder for every event: json.dumps() with options builds a new one per call.
_HEADERS_JSON = json.JSONEncoder(separators=(",", ":"))


def _close_quietly(conn: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):
        conn.close()


def _user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute(PRAGMA_USER_VERSION).fetchone()[0])


def _insert_new(conn: sqlite3.Connection, adds: list[_Add]) -> list[_Result]:
    """Insert the events whose id is not stored yet; each add's result is whether it was new."""
    ids = json.dumps([add.id for add in adds])
    seen = {row[0] for row in conn.execute(SELECT_EXISTING_IDS, (ids,))}
    held = held_outcomes(conn, [add.outcome[0] for add in adds if add.outcome is not None])
    fresh: list[_Add] = []
    results: list[_Result] = []
    outcomes: list[tuple[str, str, str, float]] = []
    for add in adds:
        is_new = add.id not in seen
        if is_new and add.outcome is not None:
            key, _event_id, source, _created = add.outcome
            is_new, record = admit(held, key, source)
            if record:
                outcomes.append(add.outcome)
        results.append((add.future, True, is_new))
        if is_new:
            seen.add(add.id)
            fresh.append(add)
    if outcomes:
        conn.executemany(INSERT_OUTCOME, outcomes)
    if fresh:
        _insert_rows(conn, INSERT_EVENTS_HEAD, EVENT_ROW, [add.row for add in fresh])
        deliveries = [row for add in fresh for row in add.deliveries]
        if deliveries:
            _insert_rows(conn, INSERT_DELIVERIES_HEAD, DELIVERY_ROW, deliveries)
    return results


def _single_insert(add: _Add) -> Callable[[sqlite3.Connection], bool]:
    def run(conn: sqlite3.Connection) -> bool:
        ((_future, _ok, is_new),) = _insert_new(conn, [add])
        return bool(is_new)

    return run


def _with_deliveries(conn: sqlite3.Connection, rows: Sequence[Sequence[Any]]) -> list[EventRecord]:
    """EventRecords for event rows (``EVENT_COLUMNS`` first), with their deliveries by sink."""
    if not rows:
        return []
    ids = json.dumps([row[0] for row in rows])
    return event_records(rows, conn.execute(SELECT_DELIVERIES, (ids,)))
