"""The SQLite inbox's statements and the small queries the store's parts share."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import aiosqlite

from receiver.errors import UnknownEvent
from receiver.store import rules
from receiver.store.lanes_model import LanePolicy, LaneState
from receiver.store.records import (
    DELIVERY_COLUMNS,
    EVENT_COLUMNS,
    EventRecord,
    EventState,
    event_records,
)

# Lists of ids travel as one JSON array parameter, so every statement stays a fixed string.
# Intake's one look before a group's inserts, one statement for both tables: (0, id, NULL) for
# each event id stored already (?1, the ids), (1, key, source) for each job outcome the ledger
# holds already (?2, the keys).
SELECT_STORED = """
SELECT 0, id, NULL FROM events WHERE id IN (SELECT value FROM json_each(?1))
UNION ALL
SELECT 1, key, source FROM job_outcomes WHERE key IN (SELECT value FROM json_each(?2))
"""

INSERT_EVENT = """
INSERT INTO events (id, event, job_id, body, headers, received_at, state, enrich_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
"""

INSERT_DELIVERY = """
INSERT INTO deliveries (event_id, sink, state, attempts, next_attempt_at, last_error, updated_at)
VALUES (?, ?, 'pending', 0, ?, NULL, ?)
"""

# A group of events goes in with one multi-row INSERT per table (see _rows_statement): one
# statement step for the whole group instead of one per row, each of which would hand the GIL
# back and forth with the event loop.
INSERT_EVENTS_HEAD = """
INSERT INTO events (id, event, job_id, body, headers, received_at, state, enrich_at)
VALUES """
EVENT_ROW = "(?, ?, ?, ?, ?, ?, ?, ?)"
INSERT_DELIVERIES_HEAD = """
INSERT INTO deliveries (event_id, sink, state, attempts, next_attempt_at, last_error, updated_at)
VALUES """
DELIVERY_ROW = "(?, ?, 'pending', 0, ?, NULL, ?)"
# 8 parameters a row: well under SQLite's 32766 parameters a statement.
ROWS_PER_STATEMENT = 256

# Checkpoints run on their own connection, once this many events and jobs were written since the
# last one, or at least every CHECKPOINT_INTERVAL_SECONDS when anything was: each checkpoint
# ends with an fsync of the database file, which every other fsync on the disk waits behind.
CHECKPOINT_EVERY_ITEMS = 500
CHECKPOINT_INTERVAL_SECONDS = 1.0
CHECKPOINT_RETRY_SECONDS = 0.05
# A WAL that a background checkpoint found this long (pages, ~64 MB) is finished off by the
# writer between two groups: under constant load the WAL would otherwise never restart.
WAL_RESTART_PAGES = 16000


CLAIM_ENRICHMENT = """
UPDATE events SET lease_owner = :owner, lease_expires_at = :expires
WHERE id IN (
    SELECT id FROM events
    WHERE enrich_at <= :now AND (lease_expires_at IS NULL OR lease_expires_at < :now)
    ORDER BY enrich_at, rowid
    LIMIT :limit
)
RETURNING id, enrich_at, rowid
"""

# A refetched snapshot never replaces a newer one.
SAVE_SNAPSHOT = """
UPDATE events
SET snapshot = ?, fetched_at = ?, enrich_at = NULL, enrich_error = NULL,
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = ? AND (fetched_at IS NULL OR fetched_at <= ?)
"""

FAIL_ENRICHMENT = """
UPDATE events
SET enrich_attempts = enrich_attempts + 1, enrich_error = ?, enrich_at = ?,
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = ?
"""

SELECT_PENDING_SINKS = "SELECT sink FROM deliveries WHERE event_id = ? AND state = 'pending'"

SELECT_LANE = """
SELECT tokens, refilled_at, paused_until, failures, opened_at FROM lanes WHERE sink = ?
"""

UPSERT_LANE = """
INSERT INTO lanes (sink, tokens, refilled_at, paused_until, failures, opened_at)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (sink) DO UPDATE SET
    tokens = excluded.tokens, refilled_at = excluded.refilled_at,
    paused_until = excluded.paused_until, failures = excluded.failures,
    opened_at = excluded.opened_at
"""

# A lane's due deliveries whose event has its snapshot, oldest due first.
CLAIM_DELIVERIES = """
UPDATE deliveries SET lease_owner = :owner, lease_expires_at = :expires
WHERE sink = :sink AND event_id IN (
    SELECT d.event_id FROM deliveries d JOIN events e ON e.id = d.event_id
    WHERE d.sink = :sink AND d.state = 'pending' AND d.next_attempt_at <= :now
      AND (d.lease_expires_at IS NULL OR d.lease_expires_at < :now)
      AND e.fetched_at IS NOT NULL
    ORDER BY d.next_attempt_at, d.event_id
    LIMIT :limit
)
RETURNING event_id, next_attempt_at
"""

NEXT_DUE = """
SELECT min(d.next_attempt_at) FROM deliveries d JOIN events e ON e.id = d.event_id
WHERE d.sink = ? AND d.state = 'pending' AND d.next_attempt_at > ?
  AND e.fetched_at IS NOT NULL
"""

LANE_STATS = """
SELECT sink,
       sum(waiting AND due AND enriched),
       min(CASE WHEN waiting AND due AND enriched THEN next_attempt_at END),
       sum(NOT waiting)
FROM (
    SELECT d.sink, d.next_attempt_at,
           (d.lease_expires_at IS NULL OR d.lease_expires_at < :now) AS waiting,
           d.next_attempt_at <= :now AS due,
           e.fetched_at IS NOT NULL AS enriched
    FROM deliveries d JOIN events e ON e.id = d.event_id
    WHERE d.state = 'pending'
)
GROUP BY sink
"""

EXTEND_EVENT_LEASES = """
UPDATE events SET lease_expires_at = ?
WHERE id IN (SELECT value FROM json_each(?)) AND lease_owner = ?
"""

RELEASE_EVENTS = """
UPDATE events SET lease_owner = NULL, lease_expires_at = NULL
WHERE id IN (SELECT value FROM json_each(?)) AND lease_owner = ?
"""

EXTEND_DELIVERY_LEASE = """
UPDATE deliveries SET lease_expires_at = ? WHERE event_id = ? AND sink = ? AND lease_owner = ?
"""

RELEASE_DELIVERY = """
UPDATE deliveries SET lease_owner = NULL, lease_expires_at = NULL
WHERE event_id = ? AND sink = ? AND lease_owner = ?
"""

SETTLE = """
UPDATE deliveries
SET state = ?, attempts = attempts + ?, next_attempt_at = ?, last_error = ?, updated_at = ?,
    lease_owner = NULL, lease_expires_at = NULL
WHERE event_id = ? AND sink = ?
"""

SETTLE_PENDING = SETTLE + " AND state = 'pending'"

SELECT_DELIVERY_STATES = """
SELECT event_id, state FROM deliveries WHERE event_id IN (SELECT value FROM json_each(?))
"""

SET_EVENT_STATE = "UPDATE events SET state = ? WHERE id = ? AND state != ?"

EVENT_EXISTS = "SELECT 1 FROM events WHERE id = ?"

REDELIVER = """
UPDATE deliveries
SET state = 'pending', attempts = 0, next_attempt_at = ?, last_error = NULL, updated_at = ?
WHERE event_id = ? AND state != 'skipped'
"""

REDELIVER_DEAD = """
UPDATE deliveries
SET state = 'pending', attempts = 0, next_attempt_at = ?, last_error = NULL, updated_at = ?
WHERE state = 'dead'
RETURNING event_id
"""

# An event that never got its snapshot is fetched again first.
REENRICH = """
UPDATE events SET enrich_at = ?, enrich_attempts = 0, enrich_error = NULL
WHERE id IN (SELECT value FROM json_each(?)) AND fetched_at IS NULL
"""

# Deliveries go with their event (ON DELETE CASCADE).
PRUNE_BATCH = """
DELETE FROM events WHERE id IN (
    SELECT id FROM events WHERE state = 'done' AND received_at < ? LIMIT ?
)
"""

SELECT_EVENT = "SELECT " + EVENT_COLUMNS + " FROM events WHERE id = ?"
SELECT_EVENTS = (
    "SELECT " + EVENT_COLUMNS + " FROM events WHERE id IN (SELECT value FROM json_each(?))"
)

LIST_ALL = (
    "SELECT " + EVENT_COLUMNS + " FROM events "
    "ORDER BY received_at DESC, rowid DESC LIMIT ? OFFSET ?"
)

LIST_BY_STATE = (
    "SELECT " + EVENT_COLUMNS + " FROM events WHERE state = ? "
    "ORDER BY received_at DESC, rowid DESC LIMIT ? OFFSET ?"
)

SELECT_DELIVERIES = (
    "SELECT " + DELIVERY_COLUMNS + " FROM deliveries "
    "WHERE event_id IN (SELECT value FROM json_each(?)) ORDER BY event_id, sink"
)

PING = "SELECT count(*) FROM (SELECT 1 FROM events LIMIT 1)"


async def _with_deliveries(
    conn: aiosqlite.Connection, rows: Sequence[Sequence[Any]]
) -> list[EventRecord]:
    """EventRecords for event rows (``EVENT_COLUMNS`` first), with their deliveries by sink."""
    if not rows:
        return []
    ids = json.dumps([row[0] for row in rows])
    return event_records(rows, await conn.execute_fetchall(SELECT_DELIVERIES, (ids,)))


async def _records(conn: aiosqlite.Connection, event_ids: list[str]) -> list[EventRecord]:
    rows = await conn.execute_fetchall(SELECT_EVENTS, (json.dumps(event_ids),))
    return await _with_deliveries(conn, list(rows))


async def _require_event(conn: aiosqlite.Connection, event_id: str) -> None:
    if not await conn.execute_fetchall(EVENT_EXISTS, (event_id,)):
        raise UnknownEvent(f"no event {event_id!r} in the inbox")


async def _recompute(conn: aiosqlite.Connection, event_ids: list[str]) -> dict[str, EventState]:
    """Set each event's state from its deliveries (:func:`rules.event_state`); the new states."""
    rows = await conn.execute_fetchall(SELECT_DELIVERY_STATES, (json.dumps(event_ids),))
    states = rules.event_states(event_ids, rows)
    await conn.executemany(SET_EVENT_STATE, [(s, event_id, s) for event_id, s in states.items()])
    return states


async def _lane(conn: aiosqlite.Connection, policy: LanePolicy, now: float) -> LaneState:
    rows = await conn.execute_fetchall(SELECT_LANE, (policy.sink,))
    return LaneState(*next(iter(rows))) if rows else rules.fresh_lane(policy, now)


# -- the inbox page's statements (receiver.store.browse) ----------------------------------------

# Only pending rows are read (the partial index deliveries_due).
LANES_PENDING = """
SELECT sink, count(*), min(next_attempt_at), sum(next_attempt_at <= ?), sum(lease_expires_at > ?)
FROM deliveries WHERE state = 'pending' GROUP BY sink
"""

# Served by the partial index deliveries_failing.
LANES_FAILING = """
SELECT sink, count(*) FROM deliveries
WHERE last_error IS NOT NULL AND updated_at >= ? GROUP BY sink
"""

RECENT_ERRORS = (
    "SELECT " + DELIVERY_COLUMNS + " FROM deliveries"
    " WHERE last_error IS NOT NULL ORDER BY updated_at DESC LIMIT ?"
)

# These three are served by the partial index deliveries_dead_groups (it holds the event id too).
DEAD_GROUPS = """
SELECT sink, last_error, count(*), min(updated_at), max(updated_at)
FROM deliveries WHERE state = 'dead'
GROUP BY sink, last_error ORDER BY count(*) DESC, sink, last_error LIMIT ?
"""

DEAD_SAMPLES = """
SELECT event_id FROM deliveries
WHERE state = 'dead' AND sink = ? AND last_error IS ?
ORDER BY updated_at DESC LIMIT ?
"""

DELIVERY_STATE = "SELECT state FROM deliveries WHERE event_id = ? AND sink = ?"

REDELIVER_SINK = """
UPDATE deliveries
SET state = 'pending', attempts = 0, next_attempt_at = ?, last_error = NULL, updated_at = ?
WHERE event_id = ? AND sink = ? AND state != 'skipped'
"""

REDELIVER_DEAD_GROUP = """
UPDATE deliveries
SET state = 'pending', attempts = 0, next_attempt_at = ?, last_error = NULL, updated_at = ?
WHERE state = 'dead' AND sink = ? AND last_error IS ?
RETURNING event_id
"""
