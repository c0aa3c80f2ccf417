"""The SQLite inbox's statements for redelivery batches (the flow around them is
:mod:`receiver.store.sql.batches`), and the schema they and lane pauses add. One writer at a
time: nothing needs a row lock."""

from __future__ import annotations

from receiver.store.sql.batches import SELECT_BATCH, BatchSql
from receiver.store.sqlite.lanes import SqliteLanes
from receiver.store.sqlite.records import SqliteRecords

# Version 7: redelivery batches, the batch that queued each delivery, and a lane's pause by an
# operator (beside its rate and circuit state).
BATCH_SCHEMA: tuple[str, ...] = (
    "ALTER TABLE lanes ADD COLUMN hold_since REAL",
    "ALTER TABLE lanes ADD COLUMN hold_until REAL",
    "ALTER TABLE lanes ADD COLUMN hold_reason TEXT",
    "ALTER TABLE deliveries ADD COLUMN batch_id TEXT",
    # A batch's progress, without touching a delivery no batch ever queued (intake's rows).
    "CREATE INDEX deliveries_batch ON deliveries (batch_id, state) WHERE batch_id IS NOT NULL",
    """
    CREATE TABLE redeliveries (
        id           TEXT PRIMARY KEY,
        filter       TEXT NOT NULL,
        created_by   TEXT NOT NULL,
        created_at   REAL NOT NULL,
        state        TEXT NOT NULL,
        matched      INTEGER NOT NULL,
        queued       INTEGER NOT NULL DEFAULT 0,
        cursor       TEXT,
        queued_at    REAL,
        finished_at  REAL,
        cancelled_at REAL,
        delivered    INTEGER,
        failed       INTEGER,
        skipped      INTEGER
    ) WITHOUT ROWID
    """,
    "CREATE INDEX redeliveries_created ON redeliveries (created_at)",
)


class SqliteBatches(BatchSql):
    """The batch statements as SQLite runs them."""

    RECORDS = SqliteRecords
    LANES = SqliteLanes
    LOCK_BATCH = SELECT_BATCH
    LOCK_EVENTS = "SELECT id FROM events WHERE id IN (SELECT value FROM json_each(:ids))"
    IN_IDS = "d.event_id IN (SELECT value FROM json_each(:ids))"
    IN_SINKS = "d.sink IN (SELECT value FROM json_each(:sinks))"
    REENRICH = """
UPDATE events SET enrich_at = :now, enrich_attempts = 0, enrich_error = NULL
WHERE id IN (SELECT value FROM json_each(:ids)) AND fetched_at IS NULL
"""
