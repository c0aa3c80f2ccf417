"""The Postgres inbox's statements and the small queries the store's parts share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from receiver.errors import UnknownEvent
from receiver.store import rules
from receiver.store.lanes_model import LanePolicy, LaneResult, LaneState, Leases, lane_row
from receiver.store.records import (
    DELIVERY_COLUMNS,
    EVENT_COLUMNS,
    EventRecord,
    EventState,
    event_records,
)

#: One channel for every receiver in a database; the payload names the schema that changed.
CHANNEL = "receiver_new_events"

# A group of events in one statement, which is its own transaction (no BEGIN and COMMIT round
# trips): the group's job outcomes (receiver.store.pull) claimed in the ledger in key order,
# the events the outcome rule admits (arrays of columns, one element per event: its own claim
# of its outcome, or a webhook beside an outcome a webhook brought), the deliveries of those
# that were new, and one notification for the whole group (sent by Postgres on commit, only
# when anything was new).
#
# A key another transaction is claiming makes the claim wait for it to commit; but the rest of
# the statement reads the ledger as of the statement's start, so it cannot see that outcome.
# Such an event is not judged here: it is answered in ``unjudged`` (neither stored nor
# refused), and the store runs the statement again for it, which sees the outcome. Answers the
# ids that were new and the ids not judged.
ADD_EVENTS = """
WITH rows AS (
    SELECT * FROM unnest(
        $1::text[], $2::text[], $3::text[], $4::bytea[], $5::json[],
        $6::double precision[], $7::text[], $8::double precision[], $14::text[], $15::text[]
    ) AS r (id, event, job_id, body, headers, received_at, state, enrich_at, key, source)
), claimed AS (
    INSERT INTO job_outcomes (key, event_id, source, created_at)
    SELECT key, id, source, received_at FROM rows WHERE key IS NOT NULL ORDER BY key, id
    ON CONFLICT (key) DO NOTHING
    RETURNING key, event_id, source
), judged AS (
    SELECT r.*, coalesce(c.event_id, o.event_id) AS holder, coalesce(c.source, o.source) AS held_by
    FROM rows r
    LEFT JOIN claimed c ON c.key = r.key
    LEFT JOIN job_outcomes o ON o.key = r.key
), ins AS (
    INSERT INTO events (id, event, job_id, body, headers, received_at, state, enrich_at)
    SELECT id, event, job_id, body, headers, received_at, state, enrich_at FROM judged
    WHERE key IS NULL OR holder = id OR (held_by = 'webhook' AND source = 'webhook')
    ORDER BY id
    ON CONFLICT (id) DO NOTHING
    RETURNING id
), dels AS (
    INSERT INTO deliveries (event_id, sink, state, attempts, next_attempt_at, updated_at)
    SELECT d.event_id, d.sink, 'pending', 0, d.at, d.at
    FROM unnest($9::text[], $10::text[], $11::double precision[]) AS d (event_id, sink, at)
    JOIN ins ON ins.id = d.event_id
)
SELECT coalesce(array_agg(id), '{}') AS added,
       CASE WHEN count(*) > 0 THEN pg_notify($12, $13) END AS notified,
       (SELECT coalesce(array_agg(id), '{}') FROM judged WHERE key IS NOT NULL AND holder IS NULL)
           AS unjudged
FROM ins
"""

# Enrichment: events without a snapshot yet, due, nobody holding them; oldest due first.
CLAIM_ENRICHMENT = """
WITH due AS (
    SELECT id FROM events
    WHERE enrich_at <= $1 AND (lease_expires_at IS NULL OR lease_expires_at < $1)
    ORDER BY enrich_at, seq
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE events e SET lease_owner = $3, lease_expires_at = $4
FROM due WHERE e.id = due.id
RETURNING e.id, e.enrich_at, e.seq
"""

# A refetched snapshot never replaces a newer one.
SAVE_SNAPSHOT = """
UPDATE events
SET snapshot = $2, fetched_at = $3, enrich_at = NULL, enrich_error = NULL,
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = $1 AND (fetched_at IS NULL OR fetched_at <= $3)
"""

FAIL_ENRICHMENT = """
UPDATE events
SET enrich_attempts = enrich_attempts + 1, enrich_error = $2, enrich_at = $3,
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = $1
"""

SELECT_PENDING_SINKS = """
SELECT sink FROM deliveries WHERE event_id = $1 AND state = 'pending' ORDER BY sink
"""

LOCK_LANE = """
SELECT tokens, refilled_at, paused_until, failures, opened_at FROM lanes WHERE sink = $1
FOR UPDATE
"""

SELECT_LANE = """
SELECT tokens, refilled_at, paused_until, failures, opened_at FROM lanes WHERE sink = $1
"""

INSERT_LANE = """
INSERT INTO lanes (sink, tokens, refilled_at, paused_until, failures, opened_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (sink) DO NOTHING
"""

UPDATE_LANE = """
UPDATE lanes SET tokens = $2, refilled_at = $3, paused_until = $4, failures = $5, opened_at = $6
WHERE sink = $1
"""

# A lane's due deliveries whose event has its snapshot, oldest due first; rows another
# replica is claiming are skipped, never waited for.
CLAIM_DELIVERIES = """
WITH due AS (
    SELECT d.event_id FROM deliveries d JOIN events e ON e.id = d.event_id
    WHERE d.sink = $1 AND d.state = 'pending' AND d.next_attempt_at <= $2
      AND (d.lease_expires_at IS NULL OR d.lease_expires_at < $2)
      AND e.fetched_at IS NOT NULL
    ORDER BY d.next_attempt_at, d.event_id
    LIMIT $3
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE deliveries d SET lease_owner = $4, lease_expires_at = $5
FROM due WHERE d.event_id = due.event_id AND d.sink = $1
RETURNING d.event_id, d.next_attempt_at
"""

NEXT_DUE = """
SELECT min(d.next_attempt_at) FROM deliveries d JOIN events e ON e.id = d.event_id
WHERE d.sink = $1 AND d.state = 'pending' AND d.next_attempt_at > $2
  AND e.fetched_at IS NOT NULL
"""

LANE_STATS = """
SELECT d.sink,
       count(*) FILTER (WHERE waiting AND d.next_attempt_at <= $1 AND e.fetched_at IS NOT NULL),
       min(d.next_attempt_at)
           FILTER (WHERE waiting AND d.next_attempt_at <= $1 AND e.fetched_at IS NOT NULL),
       count(*) FILTER (WHERE NOT waiting)
FROM deliveries d
JOIN events e ON e.id = d.event_id,
LATERAL (SELECT d.lease_expires_at IS NULL OR d.lease_expires_at < $1 AS waiting) w
WHERE d.state = 'pending'
GROUP BY d.sink
"""

EXTEND_EVENT_LEASES = """
UPDATE events SET lease_expires_at = $1 WHERE id = ANY($2::text[]) AND lease_owner = $3
"""

RELEASE_EVENTS = """
UPDATE events SET lease_owner = NULL, lease_expires_at = NULL
WHERE id = ANY($1::text[]) AND lease_owner = $2
"""

EXTEND_DELIVERY_LEASES = """
UPDATE deliveries d SET lease_expires_at = $1
FROM unnest($2::text[], $3::text[]) AS k (event_id, sink)
WHERE d.event_id = k.event_id AND d.sink = k.sink AND d.lease_owner = $4
"""

RELEASE_DELIVERIES = """
UPDATE deliveries d SET lease_owner = NULL, lease_expires_at = NULL
FROM unnest($1::text[], $2::text[]) AS k (event_id, sink)
WHERE d.event_id = k.event_id AND d.sink = k.sink AND d.lease_owner = $3
"""

LOCK_EVENT = "SELECT id FROM events WHERE id = $1 FOR NO KEY UPDATE"

SETTLE = """
UPDATE deliveries
SET state = $1, attempts = attempts + $2, next_attempt_at = $3, last_error = $4, updated_at = $5,
    lease_owner = NULL, lease_expires_at = NULL
WHERE event_id = $6 AND sink = $7
"""

SETTLE_PENDING = SETTLE + " AND state = 'pending'"

SELECT_DELIVERY_STATES = """
SELECT event_id, state FROM deliveries WHERE event_id = ANY($1::text[])
"""

SET_EVENT_STATES = """
UPDATE events e SET state = s.state
FROM unnest($1::text[], $2::text[]) AS s (id, state)
WHERE e.id = s.id AND e.state IS DISTINCT FROM s.state
"""

REDELIVER = """
UPDATE deliveries
SET state = 'pending', attempts = 0, next_attempt_at = $1, last_error = NULL, updated_at = $1
WHERE event_id = $2 AND state != 'skipped'
"""

# An event that never got its snapshot is fetched again first.
REENRICH = """
UPDATE events SET enrich_at = $1, enrich_attempts = 0, enrich_error = NULL
WHERE id = ANY($2::text[]) AND fetched_at IS NULL
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
SET state = 'pending', attempts = 0, next_attempt_at = $1, last_error = NULL, updated_at = $1
WHERE state = 'dead' AND event_id = ANY($2::text[])
"""

NOTIFY = "SELECT pg_notify($1, $2)"

# One short statement per batch; rows someone is working on are left for the next run.
PRUNE_BATCH = """
DELETE FROM events WHERE id IN (
    SELECT id FROM events WHERE state = 'done' AND received_at < $1
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
"""

SELECT_EVENT = "SELECT " + EVENT_COLUMNS + " FROM events WHERE id = $1"
SELECT_EVENTS = "SELECT " + EVENT_COLUMNS + " FROM events WHERE id = ANY($1::text[])"

LIST_ALL = (
    "SELECT " + EVENT_COLUMNS + " FROM events "
    "ORDER BY received_at DESC, seq DESC LIMIT $1 OFFSET $2"
)

LIST_BY_STATE = (
    "SELECT " + EVENT_COLUMNS + " FROM events WHERE state = $1 "
    "ORDER BY received_at DESC, seq DESC LIMIT $2 OFFSET $3"
)

SELECT_DELIVERIES = (
    "SELECT " + DELIVERY_COLUMNS + " FROM deliveries WHERE event_id = ANY($1::text[]) "
    "ORDER BY event_id, sink"
)

PING = "SELECT 1"


async def _with_deliveries(conn: Any, rows: Sequence[Any]) -> list[EventRecord]:
    """EventRecords for event rows (``EVENT_COLUMNS`` first), with their deliveries by sink."""
    if not rows:
        return []
    deliveries = await conn.fetch(SELECT_DELIVERIES, [row["id"] for row in rows])
    return event_records(rows, deliveries)


async def _records(conn: Any, event_ids: list[str]) -> list[EventRecord]:
    return await _with_deliveries(conn, await conn.fetch(SELECT_EVENTS, event_ids))


async def _lock_event(conn: Any, event_id: str) -> None:
    if await conn.fetchval(LOCK_EVENT, event_id) is None:
        raise UnknownEvent(f"no event {event_id!r} in the inbox")


async def _recompute(conn: Any, event_ids: list[str]) -> dict[str, EventState]:
    """Set each event's state from its deliveries (:func:`rules.event_state`); the new states."""
    states = rules.event_states(event_ids, await conn.fetch(SELECT_DELIVERY_STATES, event_ids))
    await conn.execute(SET_EVENT_STATES, list(states), list(states.values()))
    return states


def _keys(leases: Leases) -> tuple[list[str], list[str]]:
    return [k.event_id for k in leases.deliveries], [k.sink for k in leases.deliveries]


async def _lane(conn: Any, policy: LanePolicy, now: float) -> LaneState:
    """The lane's row, locked until the transaction ends (created full when missing)."""
    row = await conn.fetchrow(LOCK_LANE, policy.sink)
    if row is None:
        fresh = rules.fresh_lane(policy, now)
        await conn.execute(INSERT_LANE, policy.sink, *lane_row(fresh))
        row = await conn.fetchrow(LOCK_LANE, policy.sink)
    return LaneState(*row)


async def _lane_result(conn: Any, sink: str, result: LaneResult, now: float) -> None:
    """Apply one attempt's result to its lane; the row is locked only when it changes."""
    row = await conn.fetchrow(SELECT_LANE, sink)
    state = LaneState(*row) if row is not None else rules.fresh_lane(result.policy, now)
    if rules.after_result(state, result, now) is None:
        return
    state = await _lane(conn, result.policy, now)
    changed = rules.after_result(state, result, now)
    if changed is not None:
        await conn.execute(UPDATE_LANE, sink, *lane_row(changed))


# -- the inbox page's statements (receiver.store.browse) ----------------------------------------

# Only pending rows are read (the partial index deliveries_due).
LANES_PENDING = """
SELECT sink, count(*), min(next_attempt_at), count(*) FILTER (WHERE next_attempt_at <= $1),
       count(*) FILTER (WHERE lease_expires_at > $1)
FROM deliveries WHERE state = 'pending' GROUP BY sink
"""

# Served by the partial index deliveries_failing.
LANES_FAILING = """
SELECT sink, count(*) FROM deliveries
WHERE last_error IS NOT NULL AND updated_at >= $1 GROUP BY sink
"""

RECENT_ERRORS = (
    "SELECT " + DELIVERY_COLUMNS + " FROM deliveries"
    " WHERE last_error IS NOT NULL ORDER BY updated_at DESC LIMIT $1"
)

# Served by the partial index deliveries_dead_groups.
DEAD_GROUPS = """
SELECT sink, last_error, count(*), min(updated_at), max(updated_at)
FROM deliveries WHERE state = 'dead'
GROUP BY sink, last_error ORDER BY count(*) DESC, sink, last_error LIMIT $1
"""

DEAD_SAMPLES = """
SELECT event_id FROM deliveries
WHERE state = 'dead' AND sink = $1 AND last_error IS NOT DISTINCT FROM $2
ORDER BY updated_at DESC LIMIT $3
"""

DELIVERY_STATE = "SELECT state FROM deliveries WHERE event_id = $1 AND sink = $2"

REDELIVER_SINK = """
UPDATE deliveries
SET state = 'pending', attempts = 0, next_attempt_at = $1, last_error = NULL, updated_at = $1
WHERE event_id = $2 AND sink = $3 AND state != 'skipped'
"""

# Event rows first, in id order (as every other writer locks them), then their deliveries.
LOCK_DEAD_GROUP_EVENTS = """
SELECT id FROM events
WHERE id IN (SELECT event_id FROM deliveries
             WHERE state = 'dead' AND sink = $1 AND last_error IS NOT DISTINCT FROM $2)
ORDER BY id
FOR NO KEY UPDATE
"""

REDELIVER_DEAD_GROUP = """
UPDATE deliveries
SET state = 'pending', attempts = 0, next_attempt_at = $1, last_error = NULL, updated_at = $1
WHERE state = 'dead' AND event_id = ANY($2::text[]) AND sink = $3
  AND last_error IS NOT DISTINCT FROM $4
"""
