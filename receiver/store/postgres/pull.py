"""The Postgres inbox's pull-mode tables and queries (see :mod:`receiver.store.pull`; the flow
around the queries is :mod:`receiver.store.sql.pull`).

The watch list and the job-outcome ledger have their own tables (:data:`PULL_SCHEMA`, one
migration). Watch claims lock rows with ``FOR UPDATE SKIP LOCKED`` and lease them, so replicas
sharing the inbox never poll one job at the same time. The outcome check of ``add_event`` is
part of the group commit (:mod:`.intake`).
"""

from __future__ import annotations

from receiver.store.asset_ledger import FORGOTTEN_BEFORE
from receiver.store.pull import WATCH_COLUMNS
from receiver.store.sql.pull import BACKFILL_JOB_OUTCOMES, DUE_WATCHES, REARM_WATCH, PullSql
from receiver.store.sql.schema import CREATE_INDEX_WATCHES_SINCE

CREATE_WATCHES = """
CREATE TABLE watches (
    job_id           text COLLATE "C" PRIMARY KEY,
    state            text NOT NULL
                     CHECK (state IN ('watching', 'done', 'expired', 'not_found')),
    since            double precision NOT NULL,
    expires_at       double precision NOT NULL,
    next_poll_at     double precision,
    last_polled_at   double precision,
    polls            integer NOT NULL DEFAULT 0,
    last_error       text,
    updated_at       double precision NOT NULL,
    lease_owner      text,
    lease_expires_at double precision
)
"""
CREATE_INDEX_WATCHES_DUE = (
    "CREATE INDEX watches_due ON watches (next_poll_at) WHERE state = 'watching'"
)
CREATE_JOB_OUTCOMES = """
CREATE TABLE job_outcomes (
    key        text COLLATE "C" PRIMARY KEY,
    event_id   text NOT NULL,
    source     text NOT NULL,
    created_at double precision NOT NULL
)
"""
PULL_SCHEMA: tuple[str, ...] = (
    CREATE_WATCHES,
    CREATE_INDEX_WATCHES_DUE,
    CREATE_INDEX_WATCHES_SINCE,
    CREATE_JOB_OUTCOMES,
    BACKFILL_JOB_OUTCOMES,
)

# The asset ledger (receiver.store.asset_ledger), and what the events stored before it was made
# had taken in charge: each completed job's marker, the assets of its snapshot, and the types of
# the job's urls when the snapshot has no assets.
CREATE_ASSET_LEDGER = """
CREATE TABLE asset_ledger (
    key           text COLLATE "C" PRIMARY KEY,
    event_id      text NOT NULL,
    upstream_time double precision,
    created_at    double precision NOT NULL
)
"""
BACKFILL_ASSET_LEDGER = (
    """
    INSERT INTO asset_ledger (key, event_id, created_at)
    SELECT 'job ' || job_id, min(id), min(received_at) FROM events
    WHERE event = 'job.completed' AND snapshot::json #>> '{job,status}' = 'completed'
    GROUP BY job_id
    ON CONFLICT (key) DO NOTHING
    """,
    """
    INSERT INTO asset_ledger (key, event_id, created_at)
    SELECT DISTINCT ON (a ->> 'id') 'asset ' || (a ->> 'id'), e.id, e.received_at
    FROM events e, json_array_elements(e.snapshot::json -> 'assets') a
    WHERE e.event = 'job.completed' AND json_typeof(a -> 'id') = 'string'
    ON CONFLICT (key) DO NOTHING
    """,
    """
    INSERT INTO asset_ledger (key, event_id, created_at)
    SELECT DISTINCT ON (e.job_id, u) 'job ' || e.job_id || ' ' || u, e.id, e.received_at
    FROM events e, json_object_keys(e.snapshot::json #> '{job,urls}') u
    WHERE e.event = 'job.completed'
      AND json_typeof(e.snapshot::json #> '{job,urls}') = 'object'
      AND json_array_length(e.snapshot::json -> 'assets') = 0
    ON CONFLICT (key) DO NOTHING
    """,
)
ASSET_LEDGER_SCHEMA: tuple[str, ...] = (CREATE_ASSET_LEDGER, *BACKFILL_ASSET_LEDGER)


class PostgresPull(PullSql):
    """The pull-mode statements as Postgres runs them."""

    MARK_FORGOTTEN = (
        "INSERT INTO asset_ledger (key, event_id, upstream_time, created_at) "
        f"VALUES ('{FORGOTTEN_BEFORE}', '', :older_than, :older_than) "
        "ON CONFLICT (key) DO UPDATE SET "
        "upstream_time = greatest(asset_ledger.upstream_time, excluded.upstream_time)"
    )

    ADD_WATCHES = (
        """
INSERT INTO watches (job_id, state, since, expires_at, next_poll_at, polls, updated_at)
SELECT j, 'watching', :now, :expires_at, :now, 0, :now FROM unnest(:ids::text[]) AS j
"""
        + REARM_WATCH
    )

    SELECT_WATCHES = "SELECT " + WATCH_COLUMNS + " FROM watches WHERE job_id = ANY(:ids::text[])"

    CLAIM_WATCHES = f"""
WITH due AS (
{DUE_WATCHES}    FOR UPDATE SKIP LOCKED
)
UPDATE watches w SET lease_owner = :owner, lease_expires_at = :expires
FROM due WHERE w.job_id = due.job_id
RETURNING w.job_id, w.state, w.since, w.expires_at, w.last_polled_at, w.polls, w.last_error,
          w.updated_at
"""

    KNOWN_OUTCOMES = "SELECT key FROM job_outcomes WHERE key = ANY(:keys::text[])"

    SELECT_LEDGER = "SELECT key, upstream_time FROM asset_ledger WHERE key = ANY(:keys::text[])"
