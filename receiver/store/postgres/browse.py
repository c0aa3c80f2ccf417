"""The Postgres inbox's statements for reads, prunes and the inbox page (the flow
around them is :mod:`receiver.store.sql.browse`)."""

from __future__ import annotations

from receiver.store.postgres.batches import PostgresBatches
from receiver.store.postgres.records import PostgresRecords
from receiver.store.records import EVENT_COLUMNS
from receiver.store.sql.browse import BrowseSql


class PostgresBrowse(BrowseSql):
    """The statements for reads and redeliveries as Postgres runs them."""

    RECORDS = PostgresRecords
    BATCHES = PostgresBatches
    LIST_ALL = (
        "SELECT " + EVENT_COLUMNS + " FROM events "
        "ORDER BY received_at DESC, seq DESC LIMIT :limit OFFSET :offset"
    )

    LIST_BY_STATE = (
        "SELECT " + EVENT_COLUMNS + " FROM events WHERE state = :state "
        "ORDER BY received_at DESC, seq DESC LIMIT :limit OFFSET :offset"
    )

    # One short statement per batch; rows someone is working on are left for the next run.
    # Oldest first, through events_state_received: without the order the planner may read the
    # table from its start, where every row an earlier step deleted still lies until VACUUM
    # passes, so each step read more than the last (a million expired events: from 1,000 to
    # under 100 a second).
    PRUNE_BATCH = """
DELETE FROM events WHERE id IN (
    SELECT id FROM events WHERE state = 'done' AND received_at < :older_than
    ORDER BY state, received_at
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
