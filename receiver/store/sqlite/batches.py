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

# Version 8: what each delivery was before the batch that queued it (receiver.store.sql.withdraw),
# and how many deliveries a cancel withdrew. Rows queued before have nothing kept: a cancel
# leaves them to be sent, as before.
WITHDRAW_SCHEMA: tuple[str, ...] = (
    "ALTER TABLE deliveries ADD COLUMN before_batch TEXT",
    "ALTER TABLE redeliveries ADD COLUMN withdrawn INTEGER NOT NULL DEFAULT 0",
    # What a lane's claim passes over and what closing batches looks at: the few batches not
    # finished, however many there were.
    "CREATE INDEX redeliveries_unfinished ON redeliveries (state) WHERE finished_at IS NULL",
)


def exact(column: str) -> str:
    """A REAL column as a JSON number that reads back as the same value (``json_object`` writes
    15 digits; 17 always round-trip), or JSON null."""
    return f"CASE WHEN {column} IS NOT NULL THEN json(printf('%!.17g', {column})) END"


def kept(field: str) -> str:
    return f"json_extract(d.before_batch, '$.{field}')"


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
    LOCK_BATCH_WAIT = SELECT_BATCH
    SNAPSHOT = f"""json_object(
        'batch', :batch_id, 'state', d.state, 'attempts', d.attempts,
        'next_attempt_at', {exact("d.next_attempt_at")}, 'last_error', d.last_error,
        'updated_at', {exact("d.updated_at")}, 'batch_id', d.batch_id,
        'before', CASE WHEN d.state = 'pending' AND d.batch_id IS NOT NULL
            THEN json(d.before_batch) END,
        'event', json((
            SELECT json_object('enrich_at', {exact("e.enrich_at")},
                'enrich_attempts', e.enrich_attempts, 'enrich_error', e.enrich_error)
            FROM events e WHERE e.id = d.event_id AND e.fetched_at IS NULL)))"""
    WITHDRAWABLE = f"""d.state = 'pending'
    AND (d.lease_expires_at IS NULL OR d.lease_expires_at < :now)
    AND {kept("batch")} = d.batch_id"""
    KEPT_ENRICHMENT = f"""
SELECT d.event_id, {kept("event.enrich_at")}, {kept("event.enrich_attempts")},
    {kept("event.enrich_error")}
FROM deliveries d JOIN events e ON e.id = d.event_id
WHERE d.event_id IN (SELECT value FROM json_each(:ids)) AND d.batch_id = :id AND {WITHDRAWABLE}
  AND e.fetched_at IS NULL AND json_type(d.before_batch, '$.event') = 'object'
"""
    RESTORE_DELIVERIES = f"""
UPDATE deliveries AS d
SET state = {kept("state")}, attempts = {kept("attempts")},
    next_attempt_at = {kept("next_attempt_at")}, last_error = {kept("last_error")},
    updated_at = {kept("updated_at")}, batch_id = {kept("batch_id")},
    before_batch = {kept("before")}
WHERE d.event_id IN (SELECT value FROM json_each(:ids)) AND d.batch_id = :id AND {WITHDRAWABLE}
RETURNING event_id
"""
