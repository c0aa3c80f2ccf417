"""The Postgres inbox's lane statements: enrichment, delivery claims and leases (the flow around
them is :mod:`receiver.store.sql.lanes`). Several processes claim at once: candidates are locked
with ``FOR UPDATE SKIP LOCKED`` (never waited for, never taken twice), and a lane's claim first
locks that sink's row in ``lanes``, so its tokens, pause and circuit are read and written in
the claim's transaction while other lanes' claims never wait for it."""

from __future__ import annotations

from receiver.store.postgres.records import PostgresRecords
from receiver.store.sql.lanes import DUE_DELIVERIES, SELECT_LANE, LaneSql


class PostgresLanes(LaneSql):
    """The lane statements as Postgres runs them."""

    RECORDS = PostgresRecords
    LOCK_LANE = SELECT_LANE + "FOR UPDATE\n"

    # Enrichment: events without a snapshot yet, due, nobody holding them; oldest due first.
    CLAIM_ENRICHMENT = """
WITH due AS (
    SELECT id FROM events
    WHERE enrich_at <= :now AND (lease_expires_at IS NULL OR lease_expires_at < :now)
    ORDER BY enrich_at, seq
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE events e SET lease_owner = :owner, lease_expires_at = :expires
FROM due WHERE e.id = due.id
RETURNING e.id, e.enrich_at, e.seq
"""

    # A lane's due deliveries whose event has its snapshot, oldest due first; rows another
    # replica is claiming are skipped, never waited for. One a cancel is putting back as it was
    # before its batch is passed over (receiver.store.sql.withdraw: a cancelled batch, not
    # closed, and what was kept is that batch's).
    CLAIM_DELIVERIES = f"""
WITH due AS (
{DUE_DELIVERIES}    FOR UPDATE OF d SKIP LOCKED
)
UPDATE deliveries d SET lease_owner = :owner, lease_expires_at = :expires
FROM due WHERE d.event_id = due.event_id AND d.sink = :sink
  AND (d.batch_id IS NULL OR NOT (
      d.batch_id IN (SELECT id FROM redeliveries WHERE state = 'cancelled' AND finished_at IS NULL)
      AND coalesce((d.before_batch::jsonb ->> 'batch') COLLATE "C" = d.batch_id, false)))
RETURNING d.event_id, d.next_attempt_at
"""

    LANE_STATS = """
SELECT d.sink,
       count(*) FILTER (WHERE waiting AND d.next_attempt_at <= :now AND e.fetched_at IS NOT NULL),
       min(d.next_attempt_at)
           FILTER (WHERE waiting AND d.next_attempt_at <= :now AND e.fetched_at IS NOT NULL),
       count(*) FILTER (WHERE NOT waiting)
FROM deliveries d
JOIN events e ON e.id = d.event_id,
LATERAL (SELECT d.lease_expires_at IS NULL OR d.lease_expires_at < :now AS waiting) w
WHERE d.state = 'pending'
GROUP BY d.sink
"""

    EXTEND_EVENT_LEASES = """
UPDATE events SET lease_expires_at = :expires WHERE id = ANY(:ids::text[]) AND lease_owner = :owner
"""

    RELEASE_EVENTS = """
UPDATE events SET lease_owner = NULL, lease_expires_at = NULL
WHERE id = ANY(:ids::text[]) AND lease_owner = :owner
"""

    EXTEND_DELIVERY_LEASES = """
UPDATE deliveries d SET lease_expires_at = :expires
FROM unnest(:event_ids::text[], :sinks::text[]) AS k (event_id, sink)
WHERE d.event_id = k.event_id AND d.sink = k.sink AND d.lease_owner = :owner
"""

    RELEASE_DELIVERIES = """
UPDATE deliveries d SET lease_owner = NULL, lease_expires_at = NULL
FROM unnest(:event_ids::text[], :sinks::text[]) AS k (event_id, sink)
WHERE d.event_id = k.event_id AND d.sink = k.sink AND d.lease_owner = :owner
"""

    # A snapshot's ledger entries (arrays of columns); an item's entry keeps the latest upstream
    # time it was taken at.
    RECORD_ASSETS = """
INSERT INTO asset_ledger (key, event_id, upstream_time, created_at)
SELECT k, :event_id, t, :now FROM unnest(:keys::text[], :times::double precision[]) AS r (k, t)
ON CONFLICT (key) DO UPDATE SET
    upstream_time = greatest(asset_ledger.upstream_time, excluded.upstream_time)
"""
