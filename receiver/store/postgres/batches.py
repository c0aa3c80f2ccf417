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
