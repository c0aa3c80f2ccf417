"""The SQLite inbox: WAL mode, one writer task with group commit, a separate read connection.

Every write goes through one task that owns the write connection, so the process never contends
with itself for SQLite's single write lock. Concurrent :meth:`SqliteStore.add_event` calls are
queued and written together: one transaction and one fsync for the whole batch, and each caller
is answered only after that commit. Reads use their own connection (WAL readers never block the
writer). Any sqlite3 error becomes :class:`~receiver.errors.StoreUnavailable` and drops the
connection it happened on; the next call reconnects, so the store heals once the fault clears.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from receiver.config import StoreSettings
from receiver.errors import ConfigError, ReceiverError, StoreUnavailable, UnknownEvent
from receiver.store.base import (
    EVENT_STATES,
    Claim,
    DeliveryRecord,
    EventRecord,
    NewEvent,
    Outcome,
)

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

EVENT_COLUMNS = "id, event, job_id, body, headers, received_at, state"

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


@dataclass(slots=True)
class _Add:
    row: tuple[Any, ...]
    deliveries: list[tuple[Any, ...]]
    future: asyncio.Future[bool]

    @property
    def id(self) -> str:
        return str(self.row[0])


@dataclass(slots=True)
class _Job:
    fn: Callable[[aiosqlite.Connection], Awaitable[Any]]
    future: asyncio.Future[Any]


_STOP = object()


class SqliteStore:
    """The inbox in one SQLite file (WAL), written by a single group-committing writer task.

    ``path`` overrides the file named by ``settings.url``; ``busy_timeout`` is how long a write
    waits for another process's lock before raising StoreUnavailable; ``max_batch`` caps the
    events written per transaction. :attr:`commit_count` counts committed write transactions
    (tests use it to see group commit at work).
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
        self.max_batch = max_batch
        self.commit_count = 0
        self._sync = PRAGMA_SYNC_NORMAL if settings.synchronous == "normal" else PRAGMA_SYNC_FULL
        self._write: aiosqlite.Connection | None = None
        self._read: aiosqlite.Connection | None = None
        self._read_lock = asyncio.Lock()
        self._queue: asyncio.Queue[_Add | _Job | object] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._open = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def open(self) -> None:
        if self._open:
            return
        try:
            await asyncio.to_thread(self.path.parent.mkdir, parents=True, exist_ok=True)
            conn = await self._write_conn()
            await self._migrate(conn)
            await self._read_conn()
        except _DB_ERRORS as exc:
            await self._close_connections()
            raise _unavailable(exc, self.path) from exc
        except BaseException:
            await self._close_connections()
            raise
        # Fresh per open: a store may be reopened on another event loop (tests do).
        self._queue = asyncio.Queue()
        self._read_lock = asyncio.Lock()
        self._writer = asyncio.create_task(self._writer_loop(), name="sqlite-store-writer")
        self._open = True

    async def close(self) -> None:
        if not self._open:
            return
        self._open = False
        self._queue.put_nowait(_STOP)
        if self._writer is not None:
            # wait(), not await: a crashed writer must not stop the connections from closing.
            await asyncio.wait({self._writer})
            self._writer = None
        await self._close_connections()

    async def _close_connections(self) -> None:
        await self._drop_write()
        async with self._read_lock:
            await self._drop_read()

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
        try:
            await conn.execute(PRAGMA_FOREIGN_KEYS)
            await conn.execute(self._sync)
            await conn.execute(PRAGMA_JOURNAL_SIZE_LIMIT)
            rows = list(await conn.execute_fetchall(PRAGMA_JOURNAL_MODE))
            # Switching needs a write; skip it when the file is already WAL (read-only files).
            if str(rows[0][0]).lower() != "wal":
                await conn.execute(PRAGMA_WAL)
        except BaseException:
            with contextlib.suppress(sqlite3.Error, ValueError):
                await conn.close()
            raise
        return conn

    async def _write_conn(self) -> aiosqlite.Connection:
        if self._write is None:
            self._write = await self._connect()
        return self._write

    async def _read_conn(self) -> aiosqlite.Connection:
        if self._read is None:
            conn = await self._connect()
            await conn.execute(PRAGMA_QUERY_ONLY)
            self._read = conn
        return self._read

    async def _drop_write(self) -> None:
        conn, self._write = self._write, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error, ValueError):
                await conn.close()

    async def _drop_read(self) -> None:
        conn, self._read = self._read, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error, ValueError):
                await conn.close()

    async def _migrate(self, conn: aiosqlite.Connection) -> None:
        version = await self._user_version(conn)
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
        await conn.execute(BEGIN_WRITE)
        try:
            # Read again under the write lock: another process may have migrated meanwhile.
            version = await self._user_version(conn)
            for statements in MIGRATIONS[version:]:
                for statement in statements:
                    await conn.execute(statement)
            await conn.execute(COMMIT)
        except BaseException:
            with contextlib.suppress(sqlite3.Error, ValueError):
                await conn.execute(ROLLBACK)
            raise

    @staticmethod
    async def _user_version(conn: aiosqlite.Connection) -> int:
        rows = list(await conn.execute_fetchall(PRAGMA_USER_VERSION))
        return int(rows[0][0])

    # -- the writer -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if not self._open:
            raise StoreUnavailable("the inbox is not open")
        if self._writer is None or self._writer.done():
            raise StoreUnavailable("the inbox writer has stopped")

    def _submit(self, item: _Add | _Job) -> None:
        self._check_open()
        self._queue.put_nowait(item)

    async def _writer_loop(self) -> None:
        while True:
            items = [await self._queue.get()]
            while len(items) < self.max_batch:
                try:
                    items.append(self._queue.get_nowait())
                except asyncio.QueueEmpty:
                    break
            adds = [item for item in items if isinstance(item, _Add)]
            if adds:
                await self._write_batch(adds)
            for item in items:
                if isinstance(item, _Job):
                    await self._run_job(item)
            # close() enqueues _STOP after refusing new work, so nothing can follow it.
            if any(item is _STOP for item in items):
                return

    async def _write_batch(self, adds: list[_Add]) -> None:
        try:
            conn = await self._write_conn()
            await conn.execute(BEGIN_WRITE)
            try:
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
                    await conn.executemany(INSERT_EVENT, [add.row for add in fresh])
                    rows = [row for add in fresh for row in add.deliveries]
                    if rows:
                        await conn.executemany(INSERT_DELIVERY, rows)
                await conn.execute(COMMIT)
            except BaseException:
                with contextlib.suppress(sqlite3.Error, ValueError):
                    await conn.execute(ROLLBACK)
                raise
        except _DB_ERRORS as exc:
            await self._drop_write()
            for add in adds:
                if not add.future.done():
                    add.future.set_exception(_unavailable(exc, self.path))
            return
        except Exception as exc:  # a bug: fail the callers, keep the writer alive
            await self._drop_write()
            for add in adds:
                if not add.future.done():
                    add.future.set_exception(exc)
            return
        self.commit_count += 1
        for add, is_new in zip(adds, results, strict=True):
            if not add.future.done():
                add.future.set_result(is_new)

    async def _run_job(self, job: _Job) -> None:
        try:
            conn = await self._write_conn()
            await conn.execute(BEGIN_WRITE)
            try:
                result = await job.fn(conn)
                await conn.execute(COMMIT)
            except BaseException:
                with contextlib.suppress(sqlite3.Error, ValueError):
                    await conn.execute(ROLLBACK)
                raise
        except _DB_ERRORS as exc:
            await self._drop_write()
            if not job.future.done():
                job.future.set_exception(_unavailable(exc, self.path))
            return
        except Exception as exc:  # UnknownEvent, or a bug: the caller sees it as it is
            if not isinstance(exc, ReceiverError):
                await self._drop_write()
            if not job.future.done():
                job.future.set_exception(exc)
            return
        self.commit_count += 1
        if not job.future.done():
            job.future.set_result(result)

    async def _write_tx(self, fn: Callable[[aiosqlite.Connection], Awaitable[T]]) -> T:
        """Run ``fn`` in one write transaction on the writer task, after what is queued."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._submit(_Job(fn, future))
        return await future

    async def _read_tx(self, fn: Callable[[aiosqlite.Connection], Awaitable[T]]) -> T:
        """Run ``fn`` on the read connection inside one snapshot (a read transaction)."""
        self._check_open()
        async with self._read_lock:
            try:
                conn = await self._read_conn()
                await conn.execute(BEGIN_READ)
                try:
                    return await fn(conn)
                finally:
                    with contextlib.suppress(sqlite3.Error, ValueError):
                        await conn.execute(COMMIT)
            except _DB_ERRORS as exc:
                await self._drop_read()
                raise _unavailable(exc, self.path) from exc

    async def pragmas(self) -> dict[str, Any]:
        """The settings in force on the write connection (journal mode, synchronous, ...)."""

        async def run(conn: aiosqlite.Connection) -> dict[str, Any]:
            ((journal, sync, fks, busy, version),) = await conn.execute_fetchall(PRAGMA_SETTINGS)
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
        async def run(conn: aiosqlite.Connection) -> None:
            await conn.execute_fetchall(PING)

        await self._read_tx(run)

    async def add_event(self, event: NewEvent) -> bool:
        # The row is built here, in the caller's task, so a bad value fails only this caller.
        sinks = tuple(dict.fromkeys(event.sinks))
        received = event.received_at
        row = (
            event.id,
            event.event,
            event.job_id,
            event.body,
            json.dumps(dict(event.headers), separators=(",", ":")),
            received,
            "pending" if sinks else "done",
            received if sinks else None,
        )
        deliveries = [(event.id, sink, received, received) for sink in sinks]
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._submit(_Add(row, deliveries, future))
        return await future

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

        async def run(conn: aiosqlite.Connection) -> None:
            await conn.execute(EXTEND_LEASE, params)

        await self._write_tx(run)

    async def release(self, event_ids: list[str], *, owner: str) -> None:
        if not event_ids:
            return
        params = (json.dumps(list(event_ids)), owner)

        async def run(conn: aiosqlite.Connection) -> None:
            await conn.execute(RELEASE, params)

        await self._write_tx(run)

    async def settle(self, event_id: str, sink: str, outcome: Outcome, *, now: float) -> None:
        if outcome.state == "pending":
            nxt: float | None = now if outcome.next_attempt_at is None else outcome.next_attempt_at
        else:
            nxt = None
        error = None if outcome.state == "done" else outcome.error
        params = (outcome.state, int(outcome.attempted), nxt, error, now, event_id, sink)

        async def run(conn: aiosqlite.Connection) -> None:
            async with conn.execute(SETTLE, params) as cursor:
                if cursor.rowcount == 0:
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
            if not list(await conn.execute_fetchall(EVENT_EXISTS, (event_id,))):
                raise UnknownEvent(f"no event {event_id!r} in the inbox")
            async with conn.execute(REDELIVER, (now, now, event_id)) as cursor:
                count = cursor.rowcount
            await conn.execute(RECOMPUTE_EVENTS, (json.dumps([event_id]),))
            return count

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
            async with conn.execute(PRUNE_BATCH, (older_than, batch)) as cursor:
                return cursor.rowcount

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


async def _with_deliveries(
    conn: aiosqlite.Connection, rows: Sequence[Sequence[Any]]
) -> list[EventRecord]:
    """EventRecords for event rows (``EVENT_COLUMNS`` first), with their deliveries by sink."""
    if not rows:
        return []
    ids = json.dumps([row[0] for row in rows])
    by_event: dict[str, list[DeliveryRecord]] = {}
    for d in await conn.execute_fetchall(SELECT_DELIVERIES, (ids,)):
        by_event.setdefault(d[0], []).append(
            DeliveryRecord(
                event_id=d[0],
                sink=d[1],
                state=d[2],
                attempts=d[3],
                next_attempt_at=d[4],
                last_error=d[5],
                updated_at=d[6],
            )
        )
    return [_event_record(row, by_event.get(row[0], ())) for row in rows]


def _event_record(row: Sequence[Any], deliveries: Iterable[DeliveryRecord]) -> EventRecord:
    return EventRecord(
        id=row[0],
        event=row[1],
        job_id=row[2],
        body=bytes(row[3]),
        headers=json.loads(row[4]),
        received_at=row[5],
        state=row[6],
        deliveries=tuple(deliveries),
    )
