"""The Postgres inbox's statements for redelivery batches (the flow around them is
:mod:`receiver.store.sql.batches`), and the schema they and lane pauses add. Several replicas
step batches at once: a step locks its batch's row and skips a batch another replica is
stepping; it locks its events in id order, as every other writer does."""

from __future__ import annotations

from receiver.store.postgres.lanes import PostgresLanes
from receiver.store.postgres.records import PostgresRecords
from receiver.store.sql.batches import SELECT_BATCH, BatchSql

# Version 7: redelivery batches, the batch that queued each delivery, and a lane's pause by an
# operator (beside its rate and circuit state).
BATCH_SCHEMA: tuple[str, ...] = (
    """
    ALTER TABLE lanes
        ADD COLUMN hold_since double precision,
        ADD COLUMN hold_until double precision,
        ADD COLUMN hold_reason text
    """,
    'ALTER TABLE deliveries ADD COLUMN batch_id text COLLATE "C"',
    # A batch's progress, without touching a delivery no batch ever queued (intake's rows).
    "CREATE INDEX deliveries_batch ON deliveries (batch_id, state) WHERE batch_id IS NOT NULL",
    """
    CREATE TABLE redeliveries (
        id           text COLLATE "C" PRIMARY KEY,
        filter       text NOT NULL,
        created_by   text NOT NULL,
        created_at   double precision NOT NULL,
        state        text NOT NULL CHECK (state IN ('running', 'done', 'cancelled')),
        matched      bigint NOT NULL,
        queued       bigint NOT NULL DEFAULT 0,
        cursor       text COLLATE "C",
        queued_at    double precision,
        finished_at  double precision,
        cancelled_at double precision,
        delivered    bigint,
        failed       bigint,
        skipped      bigint
    )
    """,
    "CREATE INDEX redeliveries_created ON redeliveries (created_at)",
)

# Version 8: what each delivery was before the batch that queued it (receiver.store.sql.withdraw),
# and how many deliveries a cancel withdrew. Both are additive (a replica of the previous
# release keeps working beside); rows queued before, or by such a replica, have nothing kept
# for their batch: a cancel leaves them to be sent, as before.
WITHDRAW_SCHEMA: tuple[str, ...] = (
    "ALTER TABLE deliveries ADD COLUMN before_batch text",
    "ALTER TABLE redeliveries ADD COLUMN withdrawn bigint NOT NULL DEFAULT 0",
    # What a lane's claim passes over and what closing batches looks at: the few batches not
    # finished, however many there were.
    "CREATE INDEX redeliveries_unfinished ON redeliveries (state) WHERE finished_at IS NULL",
)

# What a delivery ``d`` was before its batch, as columns (``b``). Times are JSON numbers as
# float8 writes them: the shortest text that reads back as the same value (with
# extra_float_digits above 0, the default since Postgres 12).
KEPT = """jsonb_to_record(d.before_batch::jsonb) AS b (
    batch text, state text, attempts integer, next_attempt_at double precision,
    last_error text, updated_at double precision, batch_id text, before jsonb, event jsonb)"""


class PostgresBatches(BatchSql):
    """The batch statements as Postgres runs them."""

    RECORDS = PostgresRecords
    LANES = PostgresLanes
    LOCK_BATCH = SELECT_BATCH + " FOR UPDATE SKIP LOCKED"
    LOCK_EVENTS = "SELECT id FROM events WHERE id = ANY(:ids::text[]) ORDER BY id FOR NO KEY UPDATE"
    IN_IDS = "d.event_id = ANY(:ids::text[])"
    IN_SINKS = "d.sink = ANY(:sinks::text[])"
    REENRICH = """
UPDATE events SET enrich_at = :now, enrich_attempts = 0, enrich_error = NULL
WHERE id = ANY(:ids::text[]) AND fetched_at IS NULL
"""
    LOCK_BATCH_WAIT = SELECT_BATCH + " FOR UPDATE"
    SNAPSHOT = """json_build_object(
        'batch', :batch_id::text, 'state', d.state, 'attempts', d.attempts,
        'next_attempt_at', d.next_attempt_at, 'last_error', d.last_error,
        'updated_at', d.updated_at, 'batch_id', d.batch_id,
        'before', CASE WHEN d.state = 'pending' AND d.batch_id IS NOT NULL
            THEN d.before_batch::json END,
        'event', (
            SELECT json_build_object('enrich_at', e.enrich_at,
                'enrich_attempts', e.enrich_attempts, 'enrich_error', e.enrich_error)
            FROM events e WHERE e.id = d.event_id AND e.fetched_at IS NULL))::text"""
    WITHDRAWABLE = """d.state = 'pending'
    AND (d.lease_expires_at IS NULL OR d.lease_expires_at < :now)
    AND (d.before_batch::jsonb ->> 'batch') COLLATE "C" = d.batch_id"""
    KEPT_ENRICHMENT = f"""
SELECT d.event_id, (k.event ->> 'enrich_at')::double precision,
    (k.event ->> 'enrich_attempts')::integer, k.event ->> 'enrich_error'
FROM deliveries d JOIN events e ON e.id = d.event_id,
    LATERAL (SELECT b.event FROM {KEPT}) AS k
WHERE d.event_id = ANY(:ids::text[]) AND d.batch_id = :id AND {WITHDRAWABLE}
  AND e.fetched_at IS NULL AND jsonb_typeof(k.event) = 'object'
"""
    RESTORE_DELIVERIES = f"""
UPDATE deliveries AS d
SET (state, attempts, next_attempt_at, last_error, updated_at, batch_id, before_batch) = (
    SELECT b.state, b.attempts, b.next_attempt_at, b.last_error, b.updated_at, b.batch_id,
        b.before::text
    FROM {KEPT})
WHERE d.event_id = ANY(:ids::text[]) AND d.batch_id = :id AND {WITHDRAWABLE}
RETURNING d.event_id
"""
