"""The SQLite inbox's schema: the migrations (``PRAGMA user_version``), pragmas and transaction
statements of :mod:`receiver.store.sqlite`.
"""

from __future__ import annotations

from receiver.store.sql.schema import (
    BROWSE_INDEXES,
    CREATE_INDEX_DEAD,
    CREATE_INDEX_STATE_RECEIVED,
    CREATE_INDEX_STEPS,
    LEDGER_AGE_INDEXES,
)
from receiver.store.sqlite.batches import BATCH_SCHEMA, WITHDRAW_SCHEMA
from receiver.store.sqlite.pull import ASSET_LEDGER_SCHEMA, PULL_SCHEMA

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
CREATE_INDEX_RECEIVED = "CREATE INDEX events_received ON events (received_at)"

SCHEMA_V1: tuple[str, ...] = (
    CREATE_EVENTS,
    CREATE_DELIVERIES,
    CREATE_INDEX_DUE,
    CREATE_INDEX_STATE_RECEIVED,
    CREATE_INDEX_RECEIVED,
    CREATE_INDEX_DEAD,
    "PRAGMA user_version = 1",
)

# Version 2, delivery lanes: the job snapshot and enrichment state on the event, a lease per
# delivery, and one row of pacing state per lane. Events pending before are enriched again.
SCHEMA_V2: tuple[str, ...] = (
    "ALTER TABLE events ADD COLUMN snapshot TEXT",
    "ALTER TABLE events ADD COLUMN fetched_at REAL",
    "ALTER TABLE events ADD COLUMN enrich_at REAL",
    "ALTER TABLE events ADD COLUMN enrich_attempts INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE events ADD COLUMN enrich_error TEXT",
    "UPDATE events SET enrich_at = received_at, lease_owner = NULL, lease_expires_at = NULL "
    "WHERE state = 'pending'",
    "DROP INDEX events_due",
    "ALTER TABLE events DROP COLUMN next_attempt_at",
    "CREATE INDEX events_enrich ON events (enrich_at) WHERE enrich_at IS NOT NULL",
    "ALTER TABLE deliveries ADD COLUMN lease_owner TEXT",
    "ALTER TABLE deliveries ADD COLUMN lease_expires_at REAL",
    # claim_deliveries: one lane's pending rows in due order; lane_stats: every pending row.
    "CREATE INDEX deliveries_due ON deliveries (sink, next_attempt_at, event_id) "
    "WHERE state = 'pending'",
    """
    CREATE TABLE lanes (
        sink         TEXT PRIMARY KEY,
        tokens       REAL NOT NULL,
        refilled_at  REAL NOT NULL,
        paused_until REAL NOT NULL DEFAULT 0,
        failures     INTEGER NOT NULL DEFAULT 0,
        opened_at    REAL
    ) WITHOUT ROWID
    """,
    "PRAGMA user_version = 2",
)

# Version 3, the inbox page (see receiver.store.sql.schema).
SCHEMA_V3_BROWSE: tuple[str, ...] = (*BROWSE_INDEXES, "PRAGMA user_version = 3")

# Version 4: the watch list and the job-outcome ledger of pull mode (receiver.store.sqlite.pull).
SCHEMA_V4_PULL: tuple[str, ...] = (*PULL_SCHEMA, "PRAGMA user_version = 4")

# Version 5: the asset ledger reconcile judges each asset by (receiver.store.asset_ledger).
SCHEMA_V5_ASSETS: tuple[str, ...] = (*ASSET_LEDGER_SCHEMA, "PRAGMA user_version = 5")

# Version 6: the event's timeline (receiver.store.steps) and its trace context
# (receiver.observe.tracing): the span that stored it, when it was stored, and its steps.
SCHEMA_V6_STEPS: tuple[str, ...] = (
    "ALTER TABLE events ADD COLUMN trace TEXT",
    "ALTER TABLE events ADD COLUMN stored_at REAL",
    """
    CREATE TABLE event_steps (
        seq        INTEGER PRIMARY KEY,
        event_id   TEXT NOT NULL REFERENCES events (id) ON DELETE CASCADE,
        sink       TEXT NOT NULL,
        kind       TEXT NOT NULL,
        name       TEXT NOT NULL,
        attempt    INTEGER NOT NULL,
        started_at REAL NOT NULL,
        ended_at   REAL NOT NULL,
        outcome    TEXT NOT NULL,
        error      TEXT,
        status     INTEGER
    )
    """,
    CREATE_INDEX_STEPS,
    "PRAGMA user_version = 6",
)

# Version 7: redelivery batches and lane pauses (receiver.store.sqlite.batches).
SCHEMA_V7_BATCHES: tuple[str, ...] = (*BATCH_SCHEMA, "PRAGMA user_version = 7")

# Version 8: what a batch's deliveries were before it, so a cancel can put them back
# (receiver.store.sqlite.batches).
SCHEMA_V8_WITHDRAW: tuple[str, ...] = (*WITHDRAW_SCHEMA, "PRAGMA user_version = 8")

# Version 9: the ledgers' rows by age, for their retention (receiver.store.sql.schema).
SCHEMA_V9_LEDGER_AGE: tuple[str, ...] = (*LEDGER_AGE_INDEXES, "PRAGMA user_version = 9")

# Migration N (1-based) brings the schema from version N-1 to N; each sets its own user_version.
# What each does, as `receiver migrate status` shows it, is in receiver.store.sql.versions.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    SCHEMA_V1,
    SCHEMA_V2,
    SCHEMA_V3_BROWSE,
    SCHEMA_V4_PULL,
    SCHEMA_V5_ASSETS,
    SCHEMA_V6_STEPS,
    SCHEMA_V7_BATCHES,
    SCHEMA_V8_WITHDRAW,
    SCHEMA_V9_LEDGER_AGE,
)
SCHEMA_VERSION = len(MIGRATIONS)

PRAGMA_FOREIGN_KEYS = "PRAGMA foreign_keys = ON"
PRAGMA_SYNC_FULL = "PRAGMA synchronous = FULL"
PRAGMA_SYNC_NORMAL = "PRAGMA synchronous = NORMAL"
PRAGMA_JOURNAL_MODE = "PRAGMA journal_mode"
PRAGMA_WAL = "PRAGMA journal_mode = WAL"
PRAGMA_QUERY_ONLY = "PRAGMA query_only = ON"
# Checkpoints reset the WAL, but it keeps its size; cap what stays on disk after a burst.
PRAGMA_JOURNAL_SIZE_LIMIT = "PRAGMA journal_size_limit = 67108864"
# A multi-row statement inside a transaction keeps an undo copy of each page it changes (its
# statement journal), so it can be undone alone; past 64 KiB SQLite writes that copy to a new
# temporary file, one per group written. On the intake connection, whose statements are bounded
# by the group size, it stays in memory instead: about half the intake writer's syscalls. (Not
# on the work connection: redelivering every dead letter at once may touch the whole table.)
PRAGMA_TEMP_STORE_MEMORY = "PRAGMA temp_store = MEMORY"
PRAGMA_USER_VERSION = "PRAGMA user_version"
# Commits never checkpoint inline (a checkpoint copies the WAL into the database file and fsyncs
# it: milliseconds a commit, and every request waiting on it, would otherwise wait for).
PRAGMA_NO_AUTOCHECKPOINT = "PRAGMA wal_autocheckpoint = 0"
CHECKPOINT = "PRAGMA wal_checkpoint(PASSIVE)"
# After a fault: copy the whole WAL into the database file and truncate it to zero bytes.
CHECKPOINT_TRUNCATE = "PRAGMA wal_checkpoint(TRUNCATE)"
PRAGMA_SETTINGS = """
SELECT
    (SELECT journal_mode FROM pragma_journal_mode),
    (SELECT synchronous FROM pragma_synchronous),
    (SELECT foreign_keys FROM pragma_foreign_keys),
    (SELECT timeout FROM pragma_busy_timeout),
    (SELECT user_version FROM pragma_user_version),
    (SELECT temp_store FROM pragma_temp_store)
"""

BEGIN_WRITE = "BEGIN IMMEDIATE"
BEGIN_READ = "BEGIN"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
# Each job of a group runs inside its own savepoint: a job that fails alone is undone alone.
SAVEPOINT = "SAVEPOINT item"
RELEASE_SAVEPOINT = "RELEASE item"
ROLLBACK_SAVEPOINT = "ROLLBACK TO item"
