"""The Postgres inbox: one database shared by several receiver replicas (``receiver[postgres]``).

Semantics are the SQLite store's (see :mod:`receiver.store.base`); what changes is that several
processes write at once:

- A duplicate event id is settled by the primary key (``INSERT ... ON CONFLICT DO NOTHING``):
  two replicas storing the same event at the same moment both succeed, one row exists, and
  exactly one of them is told the event is new.
- Claims lock candidate rows with ``FOR UPDATE SKIP LOCKED``, so replicas never wait for each
  other nor take the same event; a lease still bounds how long a claim lives.
- Each new event sends ``NOTIFY receiver_new_events`` (payload: the schema) in the inserting
  statement; :meth:`PostgresStore.on_new_events` LISTENs on a connection of its own and wakes
  idle workers at once. Polling stays the fallback while that connection is down.
- Settling, redelivering and recomputing an event lock its row first, so two deliveries of one
  event settled on two connections cannot both miss the other's result.
- Schema migrations are numbered, recorded in ``receiver_schema_migrations`` and applied under a
  transaction-scoped advisory lock: replicas starting together migrate once.

Every driver or network error becomes :class:`~receiver.errors.StoreUnavailable`. The pool
replaces broken connections on the next use, so the store heals by itself once Postgres answers
again (after a restart, a failover or a dropped connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import asyncpg

from receiver.config import StoreSettings
from receiver.errors import StoreUnavailable, UnknownEvent
from receiver.logs import get_logger, redact_url
from receiver.store.base import (
    EVENT_COLUMNS,
    EVENT_STATES,
    Claim,
    EventRecord,
    NewEvent,
    Outcome,
    event_records,
)
from receiver.store.postgres_pull import ADD_EVENT, PULL_SCHEMA, PostgresPull
from receiver.store.postgres_pull import command_count as _count
from receiver.store.pull import outcome_key

T = TypeVar("T")

log = get_logger("receiver.store.postgres")

#: One channel for every receiver in a database; the payload names the schema that changed.
CHANNEL = "receiver_new_events"
#: Statements retried at once when Postgres aborted them to break a lock cycle.
RETRIES_ON_CONFLICT = 3
LISTEN_BACKOFF_MAX_SECONDS = 30.0
LISTEN_HEALTH_SECONDS = 30.0
#: Statements of a migration, and waiting for another replica's migration, may take this long.
MIGRATION_TIMEOUT_SECONDS = 600.0

# -- schema -------------------------------------------------------------------------------------

# Times are unix seconds (double precision), as in the Store interface. Ids and sink names use
# the "C" collation: byte order, as SQLite and Python sort them.
CREATE_EVENTS = """
CREATE TABLE events (
    id               text COLLATE "C" PRIMARY KEY,
    seq              bigint GENERATED ALWAYS AS IDENTITY,
    event            text NOT NULL,
    job_id           text NOT NULL,
    body             bytea NOT NULL,
    headers          json NOT NULL,
    received_at      double precision NOT NULL,
    state            text NOT NULL CHECK (state IN ('pending', 'done', 'dead')),
    next_attempt_at  double precision,
    lease_owner      text,
    lease_expires_at double precision
) WITH (fillfactor = 80)
"""

CREATE_DELIVERIES = """
CREATE TABLE deliveries (
    event_id        text COLLATE "C" NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    sink            text COLLATE "C" NOT NULL,
    state           text NOT NULL CHECK (state IN ('pending', 'done', 'dead', 'skipped')),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at double precision,
    last_error      text,
    updated_at      double precision NOT NULL,
    PRIMARY KEY (event_id, sink)
)
"""

# claim: an ordered range scan over pending rows only, however many finished rows are kept.
CREATE_INDEX_DUE = (
    "CREATE INDEX events_due ON events (next_attempt_at, seq) WHERE state = 'pending'"
)
# prune (state = 'done', received_at < $1), list by state, counts, oldest pending.
CREATE_INDEX_STATE_RECEIVED = "CREATE INDEX events_state_received ON events (state, received_at)"
CREATE_INDEX_RECEIVED = "CREATE INDEX events_received ON events (received_at, seq)"
# redeliver_dead without scanning every delivery; dead rows are few.
CREATE_INDEX_DEAD = "CREATE INDEX deliveries_dead ON deliveries (event_id) WHERE state = 'dead'"


@dataclass(frozen=True)
class Migration:
    """Brings the schema from ``version - 1`` to ``version``, in one transaction."""

    version: int
    description: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "events and deliveries",
        (
            CREATE_EVENTS,
            CREATE_DELIVERIES,
            CREATE_INDEX_DUE,
            CREATE_INDEX_STATE_RECEIVED,
            CREATE_INDEX_RECEIVED,
            CREATE_INDEX_DEAD,
        ),
    ),
    Migration(2, "watch list and job outcomes (pull mode)", PULL_SCHEMA),
)
SCHEMA_VERSION = MIGRATIONS[-1].version

CREATE_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS receiver_schema_migrations (
    version     integer PRIMARY KEY,
    description text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""
MIGRATIONS_TABLE_EXISTS = "SELECT to_regclass('receiver_schema_migrations') IS NOT NULL"
SCHEMA_VERSION_QUERY = "SELECT coalesce(max(version), 0) FROM receiver_schema_migrations"
RECORD_MIGRATION = "INSERT INTO receiver_schema_migrations (version, description) VALUES ($1, $2)"
MIGRATION_LOCK = "SELECT pg_advisory_xact_lock($1)"
CURRENT_SCHEMA = "SELECT current_schema()"
SCHEMA_EXISTS = "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)"

# -- statements ---------------------------------------------------------------------------------

CLAIM = """
WITH due AS (
    SELECT id FROM events
    WHERE state = 'pending' AND next_attempt_at <= $1
      AND (lease_expires_at IS NULL OR lease_expires_at < $1)
    ORDER BY next_attempt_at, seq
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE events e SET lease_owner = $3, lease_expires_at = $4
FROM due WHERE e.id = due.id
RETURNING e.id, e.event, e.job_id, e.body, e.headers, e.received_at, e.state,
          e.next_attempt_at, e.seq
"""

EXTEND_LEASE = """
UPDATE events SET lease_expires_at = $1 WHERE id = ANY($2::text[]) AND lease_owner = $3
"""

RELEASE = """
UPDATE events SET lease_owner = NULL, lease_expires_at = NULL
WHERE id = ANY($1::text[]) AND lease_owner = $2
"""

LOCK_EVENT = "SELECT id FROM events WHERE id = $1 FOR NO KEY UPDATE"

SETTLE = """
UPDATE deliveries
SET state = $1, attempts = attempts + $2, next_attempt_at = $3, last_error = $4, updated_at = $5
WHERE event_id = $6 AND sink = $7
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
WHERE id = ANY($1::text[])
"""

REDELIVER = """
UPDATE deliveries
SET state = 'pending', attempts = 0, next_attempt_at = $1, last_error = NULL, updated_at = $1
WHERE event_id = $2 AND state != 'skipped'
"""

# Event rows first, in id order (as every other writer locks them), then their deliveries.
LOCK_DEAD_EVENTS = """
SELECT id FROM events
WHERE id IN (SELECT event_id FROM deliveries WHERE state = 'dead')
ORDER BY id
FOR NO KEY UPDATE
"""

REDELIVER_DEAD = """
UPDATE deliveries
SET state = 'pending', attempts = 0, next_attempt_at = $1, last_error = NULL, updated_at = $1
WHERE state = 'dead' AND event_id = ANY($2::text[])
"""

NOTIFY = "SELECT pg_notify($1, $2)"

# One short statement per batch; rows someone is working on are left for the next run.
PRUNE_BATCH = """
DELETE FROM events WHERE id IN (
    SELECT id FROM events WHERE state = 'done' AND received_at < $1
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
"""

SELECT_EVENT = "SELECT " + EVENT_COLUMNS + " FROM events WHERE id = $1"

LIST_ALL = (
    "SELECT " + EVENT_COLUMNS + " FROM events "
    "ORDER BY received_at DESC, seq DESC LIMIT $1 OFFSET $2"
)

LIST_BY_STATE = (
    "SELECT " + EVENT_COLUMNS + " FROM events WHERE state = $1 "
    "ORDER BY received_at DESC, seq DESC LIMIT $2 OFFSET $3"
)

SELECT_DELIVERIES = """
SELECT event_id, sink, state, attempts, next_attempt_at, last_error, updated_at
FROM deliveries WHERE event_id = ANY($1::text[])
ORDER BY event_id, sink
"""

COUNTS = """
SELECT
    (SELECT count(*) FROM events WHERE state = 'pending'),
    (SELECT count(*) FROM events WHERE state = 'done'),
    (SELECT count(*) FROM events WHERE state = 'dead'),
    (SELECT min(received_at) FROM events WHERE state = 'pending')
"""

PING = "SELECT 1"

# Errors that mean "Postgres cannot be used right now", never a bug in the caller's data.
_DB_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)
_CONFLICTS = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)


@dataclass(frozen=True)
class MigrationReport:
    """What :meth:`PostgresStore.migrate` found and did."""

    schema: str
    before: int
    after: int
    applied: tuple[int, ...]


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lock_key(schema: str) -> int:
    """A stable 64-bit advisory lock key for migrating ``schema`` (per database)."""
    digest = hashlib.sha256(b"receiver.migrate:" + schema.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PostgresStore(PostgresPull):
    """The inbox in a Postgres database, shared safely by any number of receiver processes.

    ``settings.pool_size`` caps this process's pooled connections (a process running workers
    holds one more, for LISTEN); ``settings.timeout_seconds`` bounds connecting, waiting for a
    pooled connection and each statement; ``settings.schema`` names the schema of the tables.
    """

    def __init__(self, settings: StoreSettings) -> None:
        self.settings = settings
        self.url = settings.url
        self.where = redact_url(settings.url)
        self._timeout = settings.timeout_seconds
        self._pool: Any = None
        self._schema = settings.schema
        self._callbacks: list[Callable[[], None]] = []
        self._listener: asyncio.Task[None] | None = None
        self._listen_conn: Any = None

    # -- connections ----------------------------------------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        server_settings = {}
        # Named in pg_stat_activity; a url's ?application_name=... (one per replica) wins.
        if "application_name" not in parse_qs(urlsplit(self.url).query):
            server_settings["application_name"] = "receiver"
        if self.settings.schema:
            server_settings["search_path"] = _quote_ident(self.settings.schema)
        return {
            "dsn": self.url,
            "timeout": self._timeout,
            "command_timeout": self._timeout,
            "server_settings": server_settings,
        }

    async def _connect(self) -> Any:
        return await asyncpg.connect(**self._connect_kwargs())

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        """A short, driver-free message naming the database (never its password)."""
        if isinstance(exc, TimeoutError):
            message = f"the Postgres inbox {self.where} did not answer within {self._timeout:g} s"
        elif isinstance(exc, ConnectionRefusedError):
            message = f"cannot reach the Postgres inbox {self.where}: connection refused"
        elif isinstance(exc, OSError):
            reason = exc.strerror or str(exc) or type(exc).__name__
            message = f"cannot reach the Postgres inbox {self.where}: {reason}"
        elif isinstance(exc, asyncpg.PostgresError):
            message = f"the Postgres inbox {self.where} failed: {exc}"
        else:
            message = f"the connection to the Postgres inbox {self.where} failed: {exc}"
        err = StoreUnavailable(message)
        err.__cause__ = exc
        return err

    def _bad_url(self, exc: ValueError) -> StoreUnavailable:
        return StoreUnavailable(f"store.url {self.where} is not a usable Postgres url: {exc}")

    # -- lifecycle ------------------------------------------------------------------------------

    async def open(self) -> None:
        if self._pool is not None:
            return
        try:
            conn = await self._connect()
            try:
                await self._migrate(conn, apply=self.settings.auto_migrate)
            finally:
                await self._close_conn(conn)
            self._pool = await asyncpg.create_pool(
                min_size=1,
                max_size=self.settings.pool_size,
                # Idle connections are closed after a while, so a failover is picked up.
                max_inactive_connection_lifetime=300.0,
                **self._connect_kwargs(),
            )
        except ValueError as exc:  # a malformed url or option (before any connection)
            raise self._bad_url(exc) from exc
        except _DB_ERRORS as exc:
            raise self._unavailable(exc) from exc
        if self._callbacks:
            self._start_listener()

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), self._timeout)
            except _DB_ERRORS:
                pool.terminate()

    async def _close_conn(self, conn: Any) -> None:
        try:
            await asyncio.wait_for(conn.close(), self._timeout)
        except _DB_ERRORS:
            conn.terminate()

    async def migrate(self) -> MigrationReport:
        """Create or upgrade the schema (whatever ``auto_migrate`` says); safe to run at once
        from several processes."""
        try:
            conn = await self._connect()
            try:
                return await self._migrate(conn, apply=True)
            finally:
                await self._close_conn(conn)
        except ValueError as exc:
            raise self._bad_url(exc) from exc
        except _DB_ERRORS as exc:
            raise self._unavailable(exc) from exc

    async def _migrate(self, conn: Any, *, apply: bool) -> MigrationReport:
        if not self._schema:
            schema = await conn.fetchval(CURRENT_SCHEMA)
            if schema is None:
                raise StoreUnavailable(
                    f"the Postgres inbox {self.where} has no schema on its search_path; "
                    "set store.schema"
                )
            self._schema = str(schema)
        before = await self._version(conn)
        if before > SCHEMA_VERSION:
            raise StoreUnavailable(
                f"the Postgres inbox {self.where} has schema version {before}, newer than this "
                f"receiver knows ({SCHEMA_VERSION}); upgrade the receiver"
            )
        if before == SCHEMA_VERSION:
            return MigrationReport(self._schema, before, before, ())
        if not apply:
            raise StoreUnavailable(
                f"the Postgres inbox {self.where} has schema version {before}, this receiver "
                f"needs {SCHEMA_VERSION}; run receiver migrate or enable store.auto_migrate"
            )
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
            applied = []
            for migration in MIGRATIONS[current:]:
                for statement in migration.statements:
                    await conn.execute(statement, timeout=MIGRATION_TIMEOUT_SECONDS)
                await conn.execute(RECORD_MIGRATION, migration.version, migration.description)
                applied.append(migration.version)
        if applied:
            log.info("inbox schema migrated", schema=self._schema, versions=applied)
        return MigrationReport(self._schema, before, SCHEMA_VERSION, tuple(applied))

    @staticmethod
    async def _version(conn: Any) -> int:
        if not await conn.fetchval(MIGRATIONS_TABLE_EXISTS):
            return 0
        return int(await conn.fetchval(SCHEMA_VERSION_QUERY))

    # -- running statements ---------------------------------------------------------------------

    async def _run(
        self,
        fn: Callable[[Any], Awaitable[T]],
        *,
        transaction: bool = False,
        snapshot: bool = False,
    ) -> T:
        """Run ``fn`` on a pooled connection; map driver errors.

        ``transaction`` runs it in one read-committed transaction (writes); ``snapshot`` in one
        read-only repeatable-read transaction, so an event and its deliveries are read as of
        one moment.

        The whole call, waiting for a connection included, gets ``timeout_seconds``: a hung
        database makes intake answer 503 in time, not hang with the request.
        """
        pool = self._pool
        if pool is None:
            raise StoreUnavailable("the inbox is not open")
        try:
            async with asyncio.timeout(self._timeout):
                return await self._attempts(pool, fn, transaction, snapshot)
        except TimeoutError as exc:
            raise self._unavailable(exc) from exc

    async def _attempts(
        self, pool: Any, fn: Callable[[Any], Awaitable[T]], transaction: bool, snapshot: bool
    ) -> T:
        for attempt in range(RETRIES_ON_CONFLICT + 1):
            try:
                async with pool.acquire(timeout=self._timeout) as conn:
                    if snapshot:
                        async with conn.transaction(isolation="repeatable_read", readonly=True):
                            return await fn(conn)
                    if transaction:
                        async with conn.transaction():
                            return await fn(conn)
                    return await fn(conn)
            except _CONFLICTS as exc:
                # Postgres rolled the whole transaction back: running it again is safe.
                if attempt == RETRIES_ON_CONFLICT:
                    raise self._unavailable(exc) from exc
            except _DB_ERRORS as exc:
                raise self._unavailable(exc) from exc
        raise AssertionError("unreachable")

    # -- the Store interface --------------------------------------------------------------------

    async def ping(self) -> None:
        async def run(conn: Any) -> None:
            await conn.fetchval(PING)

        await self._run(run)

    async def add_event(self, event: NewEvent) -> bool:
        sinks = list(dict.fromkeys(event.sinks))
        received = event.received_at
        args = (
            event.id,
            event.event,
            event.job_id,
            event.body,
            json.dumps(dict(event.headers), separators=(",", ":")),
            received,
            "pending" if sinks else "done",
            received if sinks else None,
            sinks,
            CHANNEL,
            self._schema,
            outcome_key(event.event, event.job_id),
            event.source,
        )

        async def run(conn: Any) -> bool:
            row = await conn.fetchrow(ADD_EVENT, *args)
            if row["unseen"]:  # the same job outcome was committed meanwhile: judge it now
                row = await conn.fetchrow(ADD_EVENT, *args)
            return bool(row["added"])

        return await self._run(run)

    async def claim(
        self, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> list[Claim]:
        if limit <= 0:
            return []

        async def run(conn: Any) -> list[Claim]:
            rows = await conn.fetch(CLAIM, now, limit, owner, now + lease_seconds)
            if not rows:
                return []
            rows = sorted(rows, key=lambda r: (r["next_attempt_at"], r["seq"]))
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

        return await self._run(run, transaction=True)

    async def extend_lease(
        self, event_ids: list[str], *, owner: str, lease_seconds: float, now: float
    ) -> None:
        if not event_ids:
            return

        async def run(conn: Any) -> None:
            await conn.execute(EXTEND_LEASE, now + lease_seconds, list(event_ids), owner)

        await self._run(run)

    async def release(self, event_ids: list[str], *, owner: str) -> None:
        if not event_ids:
            return

        async def run(conn: Any) -> None:
            await conn.execute(RELEASE, list(event_ids), owner)

        await self._run(run)

    async def settle(self, event_id: str, sink: str, outcome: Outcome, *, now: float) -> None:
        if outcome.state == "pending":
            nxt: float | None = now if outcome.next_attempt_at is None else outcome.next_attempt_at
        else:
            nxt = None
        error = None if outcome.state == "done" else outcome.error
        args = (outcome.state, int(outcome.attempted), nxt, error, now, event_id, sink)

        async def run(conn: Any) -> None:
            unknown = UnknownEvent(f"no delivery {sink!r} for event {event_id!r}")
            if await conn.fetchval(LOCK_EVENT, event_id) is None:
                raise unknown
            if _count(await conn.execute(SETTLE, *args)) == 0:
                raise unknown
            await conn.execute(RECOMPUTE_EVENTS, [event_id])

        await self._run(run, transaction=True)

    async def get(self, event_id: str) -> EventRecord | None:
        async def run(conn: Any) -> EventRecord | None:
            rows = await conn.fetch(SELECT_EVENT, event_id)
            if not rows:
                return None
            return (await _with_deliveries(conn, rows))[0]

        return await self._run(run, snapshot=True)

    async def list(
        self, *, state: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[EventRecord]:
        limit, offset = max(limit, 0), max(offset, 0)

        async def run(conn: Any) -> list[EventRecord]:
            if state is None:
                rows = await conn.fetch(LIST_ALL, limit, offset)
            else:
                rows = await conn.fetch(LIST_BY_STATE, state, limit, offset)
            return await _with_deliveries(conn, rows)

        return await self._run(run, snapshot=True)

    async def redeliver(self, event_id: str, *, now: float) -> int:
        async def run(conn: Any) -> int:
            if await conn.fetchval(LOCK_EVENT, event_id) is None:
                raise UnknownEvent(f"no event {event_id!r} in the inbox")
            count = _count(await conn.execute(REDELIVER, now, event_id))
            await conn.execute(RECOMPUTE_EVENTS, [event_id])
            if count:
                await conn.execute(NOTIFY, CHANNEL, self._schema)
            return count

        return await self._run(run, transaction=True)

    async def redeliver_dead(self, *, now: float) -> int:
        async def run(conn: Any) -> int:
            ids = [row["id"] for row in await conn.fetch(LOCK_DEAD_EVENTS)]
            if not ids:
                return 0
            count = _count(await conn.execute(REDELIVER_DEAD, now, ids))
            await conn.execute(RECOMPUTE_EVENTS, ids)
            await conn.execute(NOTIFY, CHANNEL, self._schema)
            return count

        return await self._run(run, transaction=True)

    async def prune(self, *, older_than: float, batch: int = 1000) -> int:
        batch = max(batch, 1)

        async def run(conn: Any) -> int:
            return _count(await conn.execute(PRUNE_BATCH, older_than, batch))

        total = 0
        # One short transaction per batch: row locks are held for one batch only, and rows
        # another replica is pruning or redelivering are skipped, never waited for.
        while True:
            deleted = await self._run(run)
            total += deleted
            if deleted < batch:
                return total

    async def counts(self) -> tuple[dict[str, int], float | None]:
        async def run(conn: Any) -> tuple[dict[str, int], float | None]:
            row = await conn.fetchrow(COUNTS)
            counts: dict[str, int] = {s: int(row[i]) for i, s in enumerate(EVENT_STATES)}
            return counts, row[3]

        return await self._run(run)

    # -- LISTEN/NOTIFY --------------------------------------------------------------------------

    def on_new_events(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever any process stores (or redelivers) events in this schema.

        Listens on a connection of its own, reconnecting with backoff when it drops; after each
        (re)connection the callback runs once, for whatever arrived while nobody listened.
        """
        self._callbacks.append(callback)
        if self._pool is not None:
            self._start_listener()

    def _start_listener(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(
                self._listen(), name="postgres-store-listener"
            )

    def _wake(self) -> None:
        for callback in self._callbacks:
            callback()

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if payload == self._schema:
            self._wake()

    async def _listen(self) -> None:
        delay = 0.5
        while True:
            conn = None
            try:
                conn = await self._connect()
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                await conn.add_listener(CHANNEL, self._notified)
                if delay > 0.5:
                    log.info("listening for new events again")
                delay = 0.5
                self._wake()
                while not conn.is_closed():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), LISTEN_HEALTH_SECONDS)
                    if not lost.is_set():
                        # A silent network can leave a dead socket open: ask something.
                        await conn.fetchval(PING)
            except _DB_ERRORS as exc:
                log.warning(
                    "not listening for new events; polling meanwhile",
                    error=self._unavailable(exc).message,
                    retry_in=delay,
                )
            finally:
                if conn is not None:
                    conn.terminate()
            await asyncio.sleep(delay)
            delay = min(delay * 2, LISTEN_BACKOFF_MAX_SECONDS)


async def _with_deliveries(conn: Any, rows: Sequence[Any]) -> list[EventRecord]:
    """EventRecords for event rows (``EVENT_COLUMNS`` first), with their deliveries by sink."""
    if not rows:
        return []
    deliveries = await conn.fetch(SELECT_DELIVERIES, [row["id"] for row in rows])
    return event_records(rows, deliveries)
