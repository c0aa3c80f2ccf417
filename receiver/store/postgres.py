"""The Postgres inbox: one database shared by several receiver replicas (``receiver[postgres]``).

Semantics are the SQLite store's (see :mod:`receiver.store.base`); what changes is that several
processes write at once:

- A duplicate event id is settled by the primary key (``INSERT ... ON CONFLICT DO NOTHING``):
  two replicas storing the same event at the same moment both succeed, one row exists, and
  exactly one of them is told the event is new.
- Claims lock candidate rows with ``FOR UPDATE SKIP LOCKED``, so replicas never wait for each
  other nor take the same event or delivery; a lease still bounds how long a claim lives.
- A lane's claim first locks that sink's row in ``lanes`` (``FOR UPDATE``): its tokens, pause
  and circuit are read and written in the claim's transaction, so replicas together keep to
  the sink's rate. Other lanes' claims never wait for it.
- Each new event, and each event whose job was fetched, sends ``NOTIFY receiver_new_events``
  (payload: the schema); :meth:`PostgresStore.on_new_events` LISTENs on a connection of its own
  and wakes idle workers at once. Polling stays the fallback while that connection is down.
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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import asyncpg

from receiver.config import StoreSettings
from receiver.errors import StoreUnavailable, UnknownEvent
from receiver.logs import get_logger, redact_url
from receiver.store import rules
from receiver.store.base import (
    DELIVERY_COLUMNS,
    EVENT_COLUMNS,
    EVENT_STATES,
    EventRecord,
    EventState,
    LaneClaim,
    LanePolicy,
    LaneResult,
    LaneState,
    LaneStats,
    Leases,
    NewEvent,
    Outcome,
    Snapshot,
    event_records,
    lane_row,
    leased,
)
from receiver.store.batching import GroupCommit
from receiver.store.browse import (
    Cursor,
    DeadGroup,
    DeadGroupList,
    EventList,
    EventQuery,
    InboxOverview,
    browse_sql,
    delivery_records,
    lane_counts,
    numbered,
)
from receiver.store.postgres_pull import PULL_SCHEMA, PostgresPull
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
#: Events written per group commit at most, and groups written at once: while one group's commit
#: is on its way the next one gathers, and a second one may be in flight. Intake therefore needs
#: at most GROUP_WRITERS pooled connections however many webhooks arrive at once.
MAX_GROUP = 500
GROUP_WRITERS = 2

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


# Version 2, delivery lanes: the job snapshot and enrichment state on the event, a lease per
# delivery, and one row of pacing state per lane. Events pending before are enriched again.
LANES_SCHEMA: tuple[str, ...] = (
    """
    ALTER TABLE events
        ADD COLUMN snapshot text,
        ADD COLUMN fetched_at double precision,
        ADD COLUMN enrich_at double precision,
        ADD COLUMN enrich_attempts integer NOT NULL DEFAULT 0,
        ADD COLUMN enrich_error text
    """,
    "UPDATE events SET enrich_at = received_at, lease_owner = NULL, lease_expires_at = NULL "
    "WHERE state = 'pending'",
    "DROP INDEX events_due",
    "ALTER TABLE events DROP COLUMN next_attempt_at",
    "CREATE INDEX events_enrich ON events (enrich_at, seq) WHERE enrich_at IS NOT NULL",
    """
    ALTER TABLE deliveries
        ADD COLUMN lease_owner text,
        ADD COLUMN lease_expires_at double precision
    """,
    # claim_deliveries: one lane's pending rows in due order; lane_stats: every pending row.
    "CREATE INDEX deliveries_due ON deliveries (sink, next_attempt_at, event_id) "
    "WHERE state = 'pending'",
    """
    CREATE TABLE lanes (
        sink         text COLLATE "C" PRIMARY KEY,
        tokens       double precision NOT NULL,
        refilled_at  double precision NOT NULL,
        paused_until double precision NOT NULL DEFAULT 0,
        failures     integer NOT NULL DEFAULT 0,
        opened_at    double precision
    )
    """,
)


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
    Migration(2, "delivery lanes", LANES_SCHEMA),
    Migration(
        3,
        "indexes for the inbox page",
        (
            "CREATE INDEX events_event_received ON events (event, received_at)",
            "CREATE INDEX events_job ON events (job_id)",
            "CREATE INDEX deliveries_failing ON deliveries (updated_at)"
            " WHERE last_error IS NOT NULL",
            "CREATE INDEX deliveries_dead_groups"
            " ON deliveries (sink, last_error, updated_at, state) WHERE state = 'dead'",
        ),
    ),
    Migration(4, "watch list and job outcomes (pull mode)", PULL_SCHEMA),
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

# A group of events in one transaction of two statements and one commit. First the group's job
# outcomes (receiver.store.pull) are claimed in the ledger, in key order: a key another
# transaction is claiming waits for it to commit, so the second statement, with a fresh
# snapshot, sees every outcome committed before it.
CLAIM_OUTCOMES = """
INSERT INTO job_outcomes (key, event_id, source, created_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::double precision[])
ON CONFLICT (key) DO NOTHING
"""

# Then the events the outcome rule admits (arrays of columns, one element per event: its own
# claim of its outcome, or a webhook beside an outcome a webhook brought), the deliveries of
# those that were new, and one notification for the whole group (sent by Postgres on commit,
# only when anything was new). Answers the ids that were new.
ADD_EVENTS = """
WITH rows AS (
    SELECT * FROM unnest(
        $1::text[], $2::text[], $3::text[], $4::bytea[], $5::json[],
        $6::double precision[], $7::text[], $8::double precision[], $14::text[], $15::text[]
    ) AS r (id, event, job_id, body, headers, received_at, state, enrich_at, key, source)
), allowed AS (
    SELECT r.* FROM rows r LEFT JOIN job_outcomes o ON o.key = r.key
    WHERE r.key IS NULL OR o.key IS NULL OR o.event_id = r.id
       OR (o.source = 'webhook' AND r.source = 'webhook')
), ins AS (
    INSERT INTO events (id, event, job_id, body, headers, received_at, state, enrich_at)
    SELECT id, event, job_id, body, headers, received_at, state, enrich_at FROM allowed
    ON CONFLICT (id) DO NOTHING
    RETURNING id
), dels AS (
    INSERT INTO deliveries (event_id, sink, state, attempts, next_attempt_at, updated_at)
    SELECT d.event_id, d.sink, 'pending', 0, d.at, d.at
    FROM unnest($9::text[], $10::text[], $11::double precision[]) AS d (event_id, sink, at)
    JOIN ins ON ins.id = d.event_id
)
SELECT coalesce(array_agg(id), '{}') AS added,
       CASE WHEN count(*) > 0 THEN pg_notify($12, $13) END AS notified
FROM ins
"""

# Enrichment: events without a snapshot yet, due, nobody holding them; oldest due first.
CLAIM_ENRICHMENT = """
WITH due AS (
    SELECT id FROM events
    WHERE enrich_at <= $1 AND (lease_expires_at IS NULL OR lease_expires_at < $1)
    ORDER BY enrich_at, seq
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE events e SET lease_owner = $3, lease_expires_at = $4
FROM due WHERE e.id = due.id
RETURNING e.id, e.enrich_at, e.seq
"""

# A refetched snapshot never replaces a newer one.
SAVE_SNAPSHOT = """
UPDATE events
SET snapshot = $2, fetched_at = $3, enrich_at = NULL, enrich_error = NULL,
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = $1 AND (fetched_at IS NULL OR fetched_at <= $3)
"""

FAIL_ENRICHMENT = """
UPDATE events
SET enrich_attempts = enrich_attempts + 1, enrich_error = $2, enrich_at = $3,
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = $1
"""

SELECT_PENDING_SINKS = """
SELECT sink FROM deliveries WHERE event_id = $1 AND state = 'pending' ORDER BY sink
"""

LOCK_LANE = """
SELECT tokens, refilled_at, paused_until, failures, opened_at FROM lanes WHERE sink = $1
FOR UPDATE
"""

SELECT_LANE = """
SELECT tokens, refilled_at, paused_until, failures, opened_at FROM lanes WHERE sink = $1
"""

INSERT_LANE = """
INSERT INTO lanes (sink, tokens, refilled_at, paused_until, failures, opened_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (sink) DO NOTHING
"""

UPDATE_LANE = """
UPDATE lanes SET tokens = $2, refilled_at = $3, paused_until = $4, failures = $5, opened_at = $6
WHERE sink = $1
"""

# A lane's due deliveries whose event has its snapshot, oldest due first; rows another
# replica is claiming are skipped, never waited for.
CLAIM_DELIVERIES = """
WITH due AS (
    SELECT d.event_id FROM deliveries d JOIN events e ON e.id = d.event_id
    WHERE d.sink = $1 AND d.state = 'pending' AND d.next_attempt_at <= $2
      AND (d.lease_expires_at IS NULL OR d.lease_expires_at < $2)
      AND e.fetched_at IS NOT NULL
    ORDER BY d.next_attempt_at, d.event_id
    LIMIT $3
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE deliveries d SET lease_owner = $4, lease_expires_at = $5
FROM due WHERE d.event_id = due.event_id AND d.sink = $1
RETURNING d.event_id, d.next_attempt_at
"""

NEXT_DUE = """
SELECT min(d.next_attempt_at) FROM deliveries d JOIN events e ON e.id = d.event_id
WHERE d.sink = $1 AND d.state = 'pending' AND d.next_attempt_at > $2
  AND e.fetched_at IS NOT NULL
"""

LANE_STATS = """
SELECT d.sink,
       count(*) FILTER (WHERE waiting AND d.next_attempt_at <= $1 AND e.fetched_at IS NOT NULL),
       min(d.next_attempt_at)
           FILTER (WHERE waiting AND d.next_attempt_at <= $1 AND e.fetched_at IS NOT NULL),
       count(*) FILTER (WHERE NOT waiting)
FROM deliveries d
JOIN events e ON e.id = d.event_id,
LATERAL (SELECT d.lease_expires_at IS NULL OR d.lease_expires_at < $1 AS waiting) w
WHERE d.state = 'pending'
GROUP BY d.sink
"""

EXTEND_EVENT_LEASES = """
UPDATE events SET lease_expires_at = $1 WHERE id = ANY($2::text[]) AND lease_owner = $3
"""

RELEASE_EVENTS = """
UPDATE events SET lease_owner = NULL, lease_expires_at = NULL
WHERE id = ANY($1::text[]) AND lease_owner = $2
"""

EXTEND_DELIVERY_LEASES = """
UPDATE deliveries d SET lease_expires_at = $1
FROM unnest($2::text[], $3::text[]) AS k (event_id, sink)
WHERE d.event_id = k.event_id AND d.sink = k.sink AND d.lease_owner = $4
"""

RELEASE_DELIVERIES = """
UPDATE deliveries d SET lease_owner = NULL, lease_expires_at = NULL
FROM unnest($1::text[], $2::text[]) AS k (event_id, sink)
WHERE d.event_id = k.event_id AND d.sink = k.sink AND d.lease_owner = $3
"""

LOCK_EVENT = "SELECT id FROM events WHERE id = $1 FOR NO KEY UPDATE"

SETTLE = """
UPDATE deliveries
SET state = $1, attempts = attempts + $2, next_attempt_at = $3, last_error = $4, updated_at = $5,
    lease_owner = NULL, lease_expires_at = NULL
WHERE event_id = $6 AND sink = $7
"""

SETTLE_PENDING = SETTLE + " AND state = 'pending'"

SELECT_DELIVERY_STATES = """
SELECT event_id, state FROM deliveries WHERE event_id = ANY($1::text[])
"""

SET_EVENT_STATES = """
UPDATE events e SET state = s.state
FROM unnest($1::text[], $2::text[]) AS s (id, state)
WHERE e.id = s.id AND e.state IS DISTINCT FROM s.state
"""

REDELIVER = """
UPDATE deliveries
SET state = 'pending', attempts = 0, next_attempt_at = $1, last_error = NULL, updated_at = $1
WHERE event_id = $2 AND state != 'skipped'
"""

# An event that never got its snapshot is fetched again first.
REENRICH = """
UPDATE events SET enrich_at = $1, enrich_attempts = 0, enrich_error = NULL
WHERE id = ANY($2::text[]) AND fetched_at IS NULL
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
SELECT_EVENTS = "SELECT " + EVENT_COLUMNS + " FROM events WHERE id = ANY($1::text[])"

LIST_ALL = (
    "SELECT " + EVENT_COLUMNS + " FROM events "
    "ORDER BY received_at DESC, seq DESC LIMIT $1 OFFSET $2"
)

LIST_BY_STATE = (
    "SELECT " + EVENT_COLUMNS + " FROM events WHERE state = $1 "
    "ORDER BY received_at DESC, seq DESC LIMIT $2 OFFSET $3"
)

SELECT_DELIVERIES = (
    "SELECT " + DELIVERY_COLUMNS + " FROM deliveries WHERE event_id = ANY($1::text[]) "
    "ORDER BY event_id, sink"
)

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

    Concurrent :meth:`add_event` calls are group-committed (see :mod:`receiver.store.batching`):
    one statement and one commit for every event waiting, on at most ``GROUP_WRITERS`` pooled
    connections, so the rest of the pool stays free for workers and the admin API.
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
        self._adds: GroupCommit[NewEvent, bool] = GroupCommit(
            self._write_adds, max_batch=MAX_GROUP, max_in_flight=GROUP_WRITERS
        )

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
                min_size=min(GROUP_WRITERS, self.settings.pool_size),
                max_size=self.settings.pool_size,
                # No session state is ever changed on a pooled connection (no SET, no LISTEN,
                # only transaction-scoped locks), so a release needs no reset round trip.
                reset=_keep_session,
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
        await self._adds.drain()  # what was submitted is still written and answered
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
        if self._pool is None:
            raise StoreUnavailable("the inbox is not open")
        return await self._adds.submit(event)

    async def _write_adds(self, events: list[NewEvent]) -> list[bool | BaseException]:
        """One group: one transaction; each event told whether its id was new.

        Within a group only the first event of an id can be new; the rows go in id order, so
        two groups (of two replicas) inserting the same ids lock them in the same order.
        """
        firsts: dict[str, NewEvent] = {}
        for event in events:
            firsts.setdefault(event.id, event)
        rows = sorted(firsts.values(), key=lambda e: e.id)
        columns: tuple[list[Any], ...] = ([], [], [], [], [], [], [], [])
        deliveries: tuple[list[Any], ...] = ([], [], [])
        for event in rows:
            row, sinks = rules.new_event_row(event)
            for column, value in zip(columns, row, strict=True):
                column.append(value)
            for sink in sinks:
                deliveries[0].append(event.id)
                deliveries[1].append(sink)
                deliveries[2].append(event.received_at)

        keys = [outcome_key(event.event, event.job_id) for event in rows]
        sources = [event.source for event in rows]
        claims = sorted(
            (key, event.id, event.source, event.received_at)
            for key, event in zip(keys, rows, strict=True)
            if key is not None
        )

        async def run(conn: Any) -> set[str]:
            async with conn.transaction():
                if claims:
                    claimed = (list(column) for column in zip(*claims, strict=True))
                    await conn.execute(CLAIM_OUTCOMES, *claimed)
                row = await conn.fetchrow(
                    ADD_EVENTS, *columns, *deliveries, CHANNEL, self._schema, keys, sources
                )
            return set(row["added"])

        try:
            added = await self._run(run)
        except StoreUnavailable as exc:
            return [_copy_error(exc) for _ in events]
        return [event.id in added and firsts[event.id] is event for event in events]

    # -- enrichment -----------------------------------------------------------------------------

    async def claim_enrichment(
        self, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> list[EventRecord]:
        if limit <= 0:
            return []

        async def run(conn: Any) -> list[EventRecord]:
            rows = await conn.fetch(CLAIM_ENRICHMENT, now, limit, owner, now + lease_seconds)
            if not rows:
                return []
            order = {r["id"]: (r["enrich_at"], r["seq"]) for r in rows}
            records = await _records(conn, list(order))
            return sorted(records, key=lambda record: order[record.id])

        return await self._run(run, transaction=True)

    async def save_snapshot(
        self,
        event_id: str,
        snapshot: Snapshot,
        *,
        finished: Mapping[str, Outcome] | None = None,
        now: float,
    ) -> EventState:
        settles = [rules.settle_row(event_id, sink, o, now) for sink, o in (finished or {}).items()]

        async def run(conn: Any) -> EventState:
            await _lock_event(conn, event_id)
            args = (event_id, snapshot.to_json(), snapshot.fetched_at)
            await conn.execute(SAVE_SNAPSHOT, *args)
            for settle in settles:
                await conn.execute(SETTLE_PENDING, *settle)
            # Deliveries became claimable: other replicas' lanes may look now.
            await conn.execute(NOTIFY, CHANNEL, self._schema)
            return (await _recompute(conn, [event_id]))[event_id]

        return await self._run(run, transaction=True)

    async def fail_enrichment(
        self, event_id: str, *, error: str, retry_at: float | None, now: float
    ) -> EventState:
        async def run(conn: Any) -> EventState:
            await _lock_event(conn, event_id)
            await conn.execute(FAIL_ENRICHMENT, event_id, error, retry_at)
            outcome = rules.enrichment_failed(error, retry_at)
            for row in await conn.fetch(SELECT_PENDING_SINKS, event_id):
                await conn.execute(SETTLE, *rules.settle_row(event_id, row["sink"], outcome, now))
            return (await _recompute(conn, [event_id]))[event_id]

        return await self._run(run, transaction=True)

    # -- lanes ----------------------------------------------------------------------------------

    async def claim_deliveries(
        self, policy: LanePolicy, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> LaneClaim:
        async def run(conn: Any) -> LaneClaim:
            # The lane's row lock serialises its claims across replicas: tokens are taken once.
            state = await _lane(conn, policy, now)
            granted = rules.grant(policy, state, now, limit)
            rows = []
            if granted.count > 0:
                rows = await conn.fetch(
                    CLAIM_DELIVERIES, policy.sink, now, granted.count, owner, now + lease_seconds
                )
            new_state, held = rules.after_claim(policy, granted, len(rows), now, lease_seconds)
            if new_state != state:
                await conn.execute(UPDATE_LANE, policy.sink, *lane_row(new_state))
            retry_at = held
            if len(rows) < granted.count:
                retry_at = rules.earliest(held, await conn.fetchval(NEXT_DUE, policy.sink, now))
            if not rows:
                return LaneClaim((), retry_at, held)
            order = {r["event_id"]: (r["next_attempt_at"], r["event_id"]) for r in rows}
            records = sorted(await _records(conn, list(order)), key=lambda e: order[e.id])
            return LaneClaim(tuple(leased(e, policy.sink) for e in records), retry_at, held)

        return await self._run(run, transaction=True)

    async def lane_stats(self, *, now: float) -> dict[str, LaneStats]:
        async def run(conn: Any) -> dict[str, LaneStats]:
            return {
                row[0]: LaneStats(backlog=row[1], oldest_due=row[2], in_flight=row[3])
                for row in await conn.fetch(LANE_STATS, now)
            }

        return await self._run(run)

    # -- leases ---------------------------------------------------------------------------------

    async def extend_leases(
        self, leases: Leases, *, owner: str, lease_seconds: float, now: float
    ) -> None:
        if not leases:
            return
        expires = now + lease_seconds
        event_ids, sinks = _keys(leases)

        async def run(conn: Any) -> None:
            if leases.events:
                await conn.execute(EXTEND_EVENT_LEASES, expires, list(leases.events), owner)
            if event_ids:
                await conn.execute(EXTEND_DELIVERY_LEASES, expires, event_ids, sinks, owner)

        await self._run(run)

    async def release(self, leases: Leases, *, owner: str) -> None:
        if not leases:
            return
        event_ids, sinks = _keys(leases)

        async def run(conn: Any) -> None:
            if leases.events:
                await conn.execute(RELEASE_EVENTS, list(leases.events), owner)
            if event_ids:
                await conn.execute(RELEASE_DELIVERIES, event_ids, sinks, owner)

        await self._run(run)

    # -- settling -------------------------------------------------------------------------------

    async def settle(
        self,
        event_id: str,
        sink: str,
        outcome: Outcome,
        *,
        now: float,
        lane: LaneResult | None = None,
    ) -> EventState:
        args = rules.settle_row(event_id, sink, outcome, now)

        async def run(conn: Any) -> EventState:
            unknown = UnknownEvent(f"no delivery {sink!r} for event {event_id!r}")
            if await conn.fetchval(LOCK_EVENT, event_id) is None:
                raise unknown
            if _count(await conn.execute(SETTLE, *args)) == 0:
                raise unknown
            state = (await _recompute(conn, [event_id]))[event_id]
            if lane is not None:
                await _lane_result(conn, sink, lane, now)
            return state

        return await self._run(run, transaction=True)

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
            if count:
                await conn.execute(REENRICH, now, [event_id])
                await conn.execute(NOTIFY, CHANNEL, self._schema)
            await _recompute(conn, [event_id])
            return count

        return await self._run(run, transaction=True)

    async def redeliver_dead(self, *, now: float) -> int:
        async def run(conn: Any) -> int:
            ids = [row["id"] for row in await conn.fetch(LOCK_DEAD_EVENTS)]
            if not ids:
                return 0
            count = _count(await conn.execute(REDELIVER_DEAD, now, ids))
            await conn.execute(REENRICH, now, ids)
            await _recompute(conn, ids)
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

    # -- reading for people (receiver.store.browse) ---------------------------------------------

    async def browse(
        self,
        query: EventQuery,
        *,
        before: Cursor | None = None,
        after: Cursor | None = None,
        limit: int = 50,
    ) -> EventList:
        sql, args = numbered(*browse_sql(query, before=before, after=after, limit=limit))

        async def run(conn: Any) -> EventList:
            rows = await conn.fetch(sql, *args)
            if after is not None:
                rows.reverse()
            return await _with_deliveries(conn, rows)

        return await self._run(run, snapshot=True)

    async def overview(
        self, *, now: float, failing_since: float, errors: int = 10
    ) -> InboxOverview:
        async def run(conn: Any) -> InboxOverview:
            lanes = lane_counts(
                await conn.fetch(LANES_PENDING, now),
                await conn.fetch(LANES_FAILING, failing_since),
            )
            recent = delivery_records(await conn.fetch(RECENT_ERRORS, errors))
            return InboxOverview(lanes, recent)

        return await self._run(run, snapshot=True)

    async def dead_letters(self, *, groups: int = 100, samples: int = 5) -> DeadGroupList:
        async def run(conn: Any) -> DeadGroupList:
            out = []
            for sink, error, count, first, last in await conn.fetch(DEAD_GROUPS, groups):
                rows = await conn.fetch(DEAD_SAMPLES, sink, error, samples)
                out.append(DeadGroup(sink, error, count, first, last, tuple(r[0] for r in rows)))
            return out

        return await self._run(run, snapshot=True)

    async def redeliver_sink(self, event_id: str, sink: str, *, now: float) -> int:
        async def run(conn: Any) -> int:
            await conn.fetchval(LOCK_EVENT, event_id)
            if await conn.fetchval(DELIVERY_STATE, event_id, sink) is None:
                raise UnknownEvent(f"no delivery {sink!r} for event {event_id!r}")
            count = _count(await conn.execute(REDELIVER_SINK, now, event_id, sink))
            if count:
                await conn.execute(REENRICH, now, [event_id])
                await conn.execute(NOTIFY, CHANNEL, self._schema)
            await _recompute(conn, [event_id])
            return count

        return await self._run(run, transaction=True)

    async def redeliver_dead_group(self, sink: str, error: str | None, *, now: float) -> int:
        async def run(conn: Any) -> int:
            ids = [row["id"] for row in await conn.fetch(LOCK_DEAD_GROUP_EVENTS, sink, error)]
            if not ids:
                return 0
            count = _count(await conn.execute(REDELIVER_DEAD_GROUP, now, ids, sink, error))
            await conn.execute(REENRICH, now, ids)
            await _recompute(conn, ids)
            await conn.execute(NOTIFY, CHANNEL, self._schema)
            return count

        return await self._run(run, transaction=True)

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


async def _keep_session(_conn: Any) -> None:
    """The pool's reset on release: nothing to undo (asyncpg still rolls back an open
    transaction first)."""


def _copy_error(exc: StoreUnavailable) -> StoreUnavailable:
    """One exception per caller: a shared one would collect every caller's traceback."""
    err = StoreUnavailable(exc.message)
    err.__cause__ = exc.__cause__
    return err


async def _with_deliveries(conn: Any, rows: Sequence[Any]) -> list[EventRecord]:
    """EventRecords for event rows (``EVENT_COLUMNS`` first), with their deliveries by sink."""
    if not rows:
        return []
    deliveries = await conn.fetch(SELECT_DELIVERIES, [row["id"] for row in rows])
    return event_records(rows, deliveries)


async def _records(conn: Any, event_ids: list[str]) -> list[EventRecord]:
    return await _with_deliveries(conn, await conn.fetch(SELECT_EVENTS, event_ids))


async def _lock_event(conn: Any, event_id: str) -> None:
    if await conn.fetchval(LOCK_EVENT, event_id) is None:
        raise UnknownEvent(f"no event {event_id!r} in the inbox")


async def _recompute(conn: Any, event_ids: list[str]) -> dict[str, EventState]:
    """Set each event's state from its deliveries (:func:`rules.event_state`); the new states."""
    states = rules.event_states(event_ids, await conn.fetch(SELECT_DELIVERY_STATES, event_ids))
    await conn.execute(SET_EVENT_STATES, list(states), list(states.values()))
    return states


def _keys(leases: Leases) -> tuple[list[str], list[str]]:
    return [k.event_id for k in leases.deliveries], [k.sink for k in leases.deliveries]


async def _lane(conn: Any, policy: LanePolicy, now: float) -> LaneState:
    """The lane's row, locked until the transaction ends (created full when missing)."""
    row = await conn.fetchrow(LOCK_LANE, policy.sink)
    if row is None:
        fresh = rules.fresh_lane(policy, now)
        await conn.execute(INSERT_LANE, policy.sink, *lane_row(fresh))
        row = await conn.fetchrow(LOCK_LANE, policy.sink)
    return LaneState(*row)


async def _lane_result(conn: Any, sink: str, result: LaneResult, now: float) -> None:
    """Apply one attempt's result to its lane; the row is locked only when it changes."""
    row = await conn.fetchrow(SELECT_LANE, sink)
    state = LaneState(*row) if row is not None else rules.fresh_lane(result.policy, now)
    if rules.after_result(state, result, now) is None:
        return
    state = await _lane(conn, result.policy, now)
    changed = rules.after_result(state, result, now)
    if changed is not None:
        await conn.execute(UPDATE_LANE, sink, *lane_row(changed))


# -- the inbox page's statements (receiver.store.browse) ----------------------------------------

# Only pending rows are read (the partial index deliveries_due).
LANES_PENDING = """
SELECT sink, count(*), min(next_attempt_at), count(*) FILTER (WHERE next_attempt_at <= $1),
       count(*) FILTER (WHERE lease_expires_at > $1)
FROM deliveries WHERE state = 'pending' GROUP BY sink
"""

# Served by the partial index deliveries_failing.
LANES_FAILING = """
SELECT sink, count(*) FROM deliveries
WHERE last_error IS NOT NULL AND updated_at >= $1 GROUP BY sink
"""

RECENT_ERRORS = (
    "SELECT " + DELIVERY_COLUMNS + " FROM deliveries"
    " WHERE last_error IS NOT NULL ORDER BY updated_at DESC LIMIT $1"
)

# Served by the partial index deliveries_dead_groups.
DEAD_GROUPS = """
SELECT sink, last_error, count(*), min(updated_at), max(updated_at)
FROM deliveries WHERE state = 'dead'
GROUP BY sink, last_error ORDER BY count(*) DESC, sink, last_error LIMIT $1
"""

DEAD_SAMPLES = """
SELECT event_id FROM deliveries
WHERE state = 'dead' AND sink = $1 AND last_error IS NOT DISTINCT FROM $2
ORDER BY updated_at DESC LIMIT $3
"""

DELIVERY_STATE = "SELECT state FROM deliveries WHERE event_id = $1 AND sink = $2"

REDELIVER_SINK = """
UPDATE deliveries
SET state = 'pending', attempts = 0, next_attempt_at = $1, last_error = NULL, updated_at = $1
WHERE event_id = $2 AND sink = $3 AND state != 'skipped'
"""

# Event rows first, in id order (as every other writer locks them), then their deliveries.
LOCK_DEAD_GROUP_EVENTS = """
SELECT id FROM events
WHERE id IN (SELECT event_id FROM deliveries
             WHERE state = 'dead' AND sink = $1 AND last_error IS NOT DISTINCT FROM $2)
ORDER BY id
FOR NO KEY UPDATE
"""

REDELIVER_DEAD_GROUP = """
UPDATE deliveries
SET state = 'pending', attempts = 0, next_attempt_at = $1, last_error = NULL, updated_at = $1
WHERE state = 'dead' AND event_id = ANY($2::text[]) AND sink = $3
  AND last_error IS NOT DISTINCT FROM $4
"""
