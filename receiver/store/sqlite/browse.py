"""The SQLite inbox's statements for reads, redeliveries, prunes and the inbox page (the flow
around them is :mod:`receiver.store.sql.browse`)."""

from __future__ import annotations

from receiver.store.records import EVENT_COLUMNS
from receiver.store.sql.browse import BrowseSql
from receiver.store.sqlite.records import SqliteRecords


class SqliteBrowse(BrowseSql):
    """The statements for reads and redeliveries as SQLite runs them."""

    RECORDS = SqliteRecords
    LIST_ALL = (
        "SELECT " + EVENT_COLUMNS + " FROM events "
        "ORDER BY received_at DESC, rowid DESC LIMIT :limit OFFSET :offset"
    )

    LIST_BY_STATE = (
        "SELECT " + EVENT_COLUMNS + " FROM events WHERE state = :state "
        "ORDER BY received_at DESC, rowid DESC LIMIT :limit OFFSET :offset"
    )

    # An event that never got its snapshot is fetched again first.
    REENRICH = """
UPDATE events SET enrich_at = :now, enrich_attempts = 0, enrich_error = NULL
WHERE id IN (SELECT value FROM json_each(:ids)) AND fetched_at IS NULL
"""

    # Dead deliveries are few: these are served by the partial index deliveries_dead_groups (it
    # holds the event id too).
    LOCK_DEAD_EVENTS = """
SELECT DISTINCT event_id FROM deliveries WHERE state = 'dead' ORDER BY event_id
"""

    REDELIVER_DEAD = """
UPDATE deliveries
SET state = 'pending', attempts = 0, next_attempt_at = :now, last_error = NULL, updated_at = :now
WHERE state = 'dead' AND event_id IN (SELECT value FROM json_each(:ids))
"""

    LOCK_DEAD_GROUP_EVENTS = """
SELECT DISTINCT event_id FROM deliveries
WHERE state = 'dead' AND sink = :sink AND last_error IS :error
ORDER BY event_id
"""

    REDELIVER_DEAD_GROUP = """
UPDATE deliveries
SET state = 'pending', attempts = 0, next_attempt_at = :now, last_error = NULL, updated_at = :now
WHERE state = 'dead' AND event_id IN (SELECT value FROM json_each(:ids)) AND sink = :sink
  AND last_error IS :error
"""

    # Deliveries go with their event (ON DELETE CASCADE).
    PRUNE_BATCH = """
DELETE FROM events WHERE id IN (
    SELECT id FROM events WHERE state = 'done' AND received_at < :older_than LIMIT :limit
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
