"""How the SQLite inbox reads events with their deliveries and keeps each event's state."""

from __future__ import annotations

from receiver.store.records import DELIVERY_COLUMNS, EVENT_COLUMNS
from receiver.store.sql.records import RecordSql


class SqliteRecords(RecordSql):
    """The record statements as SQLite runs them. Lists of ids travel as one JSON array
    parameter (see :mod:`.conn`)."""

    SELECT_EVENTS = (
        "SELECT " + EVENT_COLUMNS + " FROM events WHERE id IN (SELECT value FROM json_each(:ids))"
    )
    SELECT_DELIVERIES = (
        "SELECT " + DELIVERY_COLUMNS + " FROM deliveries "
        "WHERE event_id IN (SELECT value FROM json_each(:ids)) ORDER BY event_id, sink"
    )
    SELECT_DELIVERY_STATES = """
SELECT event_id, state FROM deliveries WHERE event_id IN (SELECT value FROM json_each(:ids))
"""
    # Two arrays read side by side: the second one materialized, so that SQLite indexes it for
    # the join (a join of two json_each would scan the second array once per element).
    SET_EVENT_STATES = """
WITH t (key, state) AS MATERIALIZED (SELECT key, value FROM json_each(:states))
UPDATE events SET state = s.state
FROM (SELECT i.value AS id, t.state FROM json_each(:ids) i JOIN t ON t.key = i.key) AS s
WHERE events.id = s.id AND events.state != s.state
"""
    # One writer at a time: the write transaction holds the whole file, no row needs a lock.
    LOCK_EVENT = "SELECT id FROM events WHERE id = :event_id"
    LOCKS_ROWS = False
