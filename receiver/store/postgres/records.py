"""How the Postgres inbox reads events with their deliveries and keeps each event's state."""

from __future__ import annotations

from receiver.store.records import DELIVERY_COLUMNS, EVENT_COLUMNS
from receiver.store.sql.records import RecordSql


class PostgresRecords(RecordSql):
    """The record statements as Postgres runs them."""

    SELECT_EVENTS = "SELECT " + EVENT_COLUMNS + " FROM events WHERE id = ANY(:ids::text[])"
    SELECT_DELIVERIES = (
        "SELECT " + DELIVERY_COLUMNS + " FROM deliveries WHERE event_id = ANY(:ids::text[]) "
        "ORDER BY event_id, sink"
    )
    SELECT_DELIVERY_STATES = """
SELECT event_id, state FROM deliveries WHERE event_id = ANY(:ids::text[])
"""
    SET_EVENT_STATES = """
UPDATE events e SET state = s.state
FROM unnest(:ids::text[], :states::text[]) AS s (id, state)
WHERE e.id = s.id AND e.state IS DISTINCT FROM s.state
"""
    # Several processes write at once: settling, redelivering and recomputing an event lock its
    # row first, so two deliveries of one event settled on two connections cannot both miss the
    # other's result.
    LOCK_EVENT = "SELECT id FROM events WHERE id = :event_id FOR NO KEY UPDATE"
    LOCKS_ROWS = True
