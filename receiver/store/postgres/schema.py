"""The Postgres inbox's schema: numbered migrations, recorded in ``receiver_schema_migrations``."""

from __future__ import annotations

from dataclasses import dataclass

from receiver.store.postgres.batches import BATCH_SCHEMA, WITHDRAW_SCHEMA
from receiver.store.postgres.pull import ASSET_LEDGER_SCHEMA, PULL_SCHEMA
from receiver.store.sql.schema import (
    BROWSE_INDEXES,
    CREATE_INDEX_DEAD,
    CREATE_INDEX_STATE_RECEIVED,
    CREATE_INDEX_STEPS,
    LEDGER_AGE_INDEXES,
)
from receiver.store.sql.versions import DESCRIPTIONS

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
CREATE_INDEX_RECEIVED = "CREATE INDEX events_received ON events (received_at, seq)"


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


# Version 6: the event's timeline (receiver.store.steps) and its trace context
# (receiver.observe.tracing): the span that stored it, when it was stored, and its steps.
STEPS_SCHEMA: tuple[str, ...] = (
    "ALTER TABLE events ADD COLUMN trace text, ADD COLUMN stored_at double precision",
    """
    CREATE TABLE event_steps (
        seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        event_id   text COLLATE "C" NOT NULL REFERENCES events (id) ON DELETE CASCADE,
        sink       text COLLATE "C" NOT NULL,
        kind       text NOT NULL,
        name       text NOT NULL,
        attempt    integer NOT NULL,
        started_at double precision NOT NULL,
        ended_at   double precision NOT NULL,
        outcome    text NOT NULL,
        error      text,
        status     integer
    )
    """,
    CREATE_INDEX_STEPS,
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
        DESCRIPTIONS[1],
        (
            CREATE_EVENTS,
            CREATE_DELIVERIES,
            CREATE_INDEX_DUE,
            CREATE_INDEX_STATE_RECEIVED,
            CREATE_INDEX_RECEIVED,
            CREATE_INDEX_DEAD,
        ),
    ),
    Migration(2, DESCRIPTIONS[2], LANES_SCHEMA),
    Migration(3, DESCRIPTIONS[3], BROWSE_INDEXES),
    Migration(4, DESCRIPTIONS[4], PULL_SCHEMA),
    Migration(5, DESCRIPTIONS[5], ASSET_LEDGER_SCHEMA),
    Migration(6, DESCRIPTIONS[6], STEPS_SCHEMA),
    Migration(7, DESCRIPTIONS[7], BATCH_SCHEMA),
    Migration(8, DESCRIPTIONS[8], WITHDRAW_SCHEMA),
    Migration(9, DESCRIPTIONS[9], LEDGER_AGE_INDEXES),
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


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
