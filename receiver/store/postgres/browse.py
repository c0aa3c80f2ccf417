"""The Postgres inbox's statements for reads, redeliveries, prunes and the inbox page (the flow
around them is :mod:`receiver.store.sql.browse`)."""

from __future__ import annotations

from receiver.store.postgres.records import PostgresRecords
from receiver.store.records import EVENT_COLUMNS
from receiver.store.sql.browse import BrowseSql


class PostgresBrowse(BrowseSql):
    """The statements for reads and redeliveries as Postgres runs them."""

    RECORDS = PostgresRecords
    LIST_ALL = (
        "SELECT " + EVENT_COLUMNS + " FROM events "
        "ORDER BY received_at DESC, seq DESC LIMIT :limit OFFSET :offset"
    )

    LIST_BY_STATE = (
        "SELECT " + EVENT_COLUMNS + " FROM events WHERE state = :state "
        "ORDER BY received_at DESC, seq DESC LIMIT :limit OFFSET :offset"
    )

    # An event that never got its snapshot is fetched again first.
    REENRICH = """
UPDATE events SET enrich_at = :now, enrich_attempts = 0, enrich_error = NULL
WHERE id = ANY(:ids::text[]) AND fetched_at IS NULL
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
SET state = 'pending', attempts = 0, next_attempt_at = :now, last_error = NULL, updated_at = :now
WHERE state = 'dead' AND event_id = ANY(:ids::text[])
"""

    LOCK_DEAD_GROUP_EVENTS = """
SELECT id FROM events
WHERE id IN (SELECT event_id FROM deliveries
             WHERE state = 'dead' AND sink = :sink AND last_error IS NOT DISTINCT FROM :error)
ORDER BY id
FOR NO KEY UPDATE
"""

    REDELIVER_DEAD_GROUP = """
UPDATE deliveries
SET state = 'pending', attempts = 0, next_attempt_at = :now, last_error = NULL, updated_at = :now
WHERE state = 'dead' AND event_id = ANY(:ids::text[]) AND sink = :sink
  AND last_error IS NOT DISTINCT FROM :error
"""

    # One short statement per batch; rows someone is working on are left for the next run.
    PRUNE_BATCH = """
DELETE FROM events WHERE id IN (
    SELECT id FROM events WHERE state = 'done' AND received_at < :older_than
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
"""

    # Only pending rows are read (the partial index deliveries_due).
    LANES_PENDING = """
SELECT sink, count(*), min(next_attempt_at), count(*) FILTER (WHERE next_attempt_at <= :now),
       count(*) FILTER (WHERE lease_expires_at > :now)
FROM deliveries WHERE state = 'pending' GROUP BY sink
"""

    DEAD_SAMPLES = """
SELECT event_id FROM deliveries
WHERE state = 'dead' AND sink = :sink AND last_error IS NOT DISTINCT FROM :error
ORDER BY updated_at DESC LIMIT :limit
"""
