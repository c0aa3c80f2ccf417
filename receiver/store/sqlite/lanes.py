"""The SQLite inbox's lane statements: enrichment, delivery claims and leases (the flow around
them is :mod:`receiver.store.sql.lanes`). One writer at a time: a claim is an ``UPDATE`` of the
rows its subquery picks, and a lane's row is read without a lock."""

from __future__ import annotations

from receiver.store.sql.lanes import DUE_DELIVERIES, LaneSql
from receiver.store.sqlite.records import SqliteRecords


class SqliteLanes(LaneSql):
    """The lane statements as SQLite runs them."""

    RECORDS = SqliteRecords
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

    # A lane's due deliveries whose event has its snapshot, oldest due first; of those, one a
    # cancel is putting back as it was before its batch is passed over (receiver.store.sql.
    # withdraw: a cancelled batch, not closed, and what was kept is that batch's).
    CLAIM_DELIVERIES = f"""
UPDATE deliveries SET lease_owner = :owner, lease_expires_at = :expires
WHERE sink = :sink AND event_id IN (
{DUE_DELIVERIES})
  AND (batch_id IS NULL OR NOT (
      batch_id IN (SELECT id FROM redeliveries WHERE state = 'cancelled' AND finished_at IS NULL)
      AND json_extract(before_batch, '$.batch') IS batch_id))
RETURNING event_id, next_attempt_at
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
UPDATE events SET lease_expires_at = :expires
WHERE id IN (SELECT value FROM json_each(:ids)) AND lease_owner = :owner
"""

    RELEASE_EVENTS = """
UPDATE events SET lease_owner = NULL, lease_expires_at = NULL
WHERE id IN (SELECT value FROM json_each(:ids)) AND lease_owner = :owner
"""

    # The (event id, sink) pairs of a worker's deliveries: two JSON arrays read side by side, each
    # materialized so that SQLite indexes one for the join (a join of two json_each would scan the
    # second array once per element of the first).
    DELIVERY_KEYS = """
WITH e (key, event_id) AS MATERIALIZED (SELECT key, value FROM json_each(:event_ids)),
     s (key, sink) AS MATERIALIZED (SELECT key, value FROM json_each(:sinks))
"""

    KEYS = "(SELECT e.event_id, s.sink FROM e JOIN s ON s.key = e.key)"

    EXTEND_DELIVERY_LEASES = f"""{DELIVERY_KEYS}
UPDATE deliveries SET lease_expires_at = :expires
FROM {KEYS} AS k
WHERE deliveries.event_id = k.event_id AND deliveries.sink = k.sink
  AND deliveries.lease_owner = :owner
"""

    RELEASE_DELIVERIES = f"""{DELIVERY_KEYS}
UPDATE deliveries SET lease_owner = NULL, lease_expires_at = NULL
FROM {KEYS} AS k
WHERE deliveries.event_id = k.event_id AND deliveries.sink = k.sink
  AND deliveries.lease_owner = :owner
"""

    # A snapshot's ledger entries; an item's entry keeps the latest upstream time it was taken at.
    # (``WHERE true``: an upsert's SELECT needs a WHERE, or its ON would be read as a join's.)
    RECORD_ASSETS = """
WITH k (i, key) AS MATERIALIZED (SELECT key, value FROM json_each(:keys)),
     t (i, time) AS MATERIALIZED (SELECT key, value FROM json_each(:times))
INSERT INTO asset_ledger (key, event_id, upstream_time, created_at)
SELECT k.key, :event_id, t.time, :now FROM k JOIN t ON t.i = k.i
WHERE true
ON CONFLICT (key) DO UPDATE SET upstream_time = max(
    coalesce(asset_ledger.upstream_time, excluded.upstream_time),
    coalesce(excluded.upstream_time, asset_ledger.upstream_time))
"""
