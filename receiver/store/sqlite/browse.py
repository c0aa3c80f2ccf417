"""The SQLite inbox's statements for reads, prunes and the inbox page (the flow
around them is :mod:`receiver.store.sql.browse`)."""

from __future__ import annotations

from receiver.store.records import EVENT_COLUMNS
from receiver.store.sql.browse import BrowseSql
from receiver.store.sqlite.batches import SqliteBatches
from receiver.store.sqlite.records import SqliteRecords


class SqliteBrowse(BrowseSql):
    """The statements for reads and redeliveries as SQLite runs them."""

    RECORDS = SqliteRecords
    BATCHES = SqliteBatches
    LIST_ALL = (
        "SELECT " + EVENT_COLUMNS + " FROM events "
        "ORDER BY received_at DESC, rowid DESC LIMIT :limit OFFSET :offset"
    )

    LIST_BY_STATE = (
        "SELECT " + EVENT_COLUMNS + " FROM events WHERE state = :state "
        "ORDER BY received_at DESC, rowid DESC LIMIT :limit OFFSET :offset"
    )

    # Deliveries go with their event (ON DELETE CASCADE).
    PRUNE_BATCH = """
DELETE FROM events WHERE id IN (
    SELECT id FROM events WHERE state = 'done' AND received_at < :older_than
    ORDER BY state, received_at LIMIT :limit
)
"""

    # Only pending rows are read (the partial index deliveries_due).
    LANES_PENDING = """
SELECT sink, count(*), min(next_attempt_at), sum(next_attempt_at <= :now),
       sum(lease_expires_at > :now)
FROM deliveries WHERE state = 'pending' GROUP BY sink
"""

    DEAD_SAMPLES = """
SELECT event_id FROM deliveries
WHERE state = 'dead' AND sink = :sink AND last_error IS :error
ORDER BY updated_at DESC LIMIT :limit
"""
