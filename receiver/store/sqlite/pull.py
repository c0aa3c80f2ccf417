"""The SQLite inbox's pull-mode tables and queries (see :mod:`receiver.store.pull`; the flow
around the queries is :mod:`receiver.store.sql.pull`).

The watch list and the job-outcome ledger have their own tables (:data:`PULL_SCHEMA`, one
migration); only the outcome check inside ``add_event`` lives with the event inserts
(:mod:`.intake`).
"""

from __future__ import annotations

from receiver.store.asset_ledger import FORGOTTEN_BEFORE
from receiver.store.pull import WATCH_COLUMNS
from receiver.store.sql.pull import BACKFILL_JOB_OUTCOMES, DUE_WATCHES, REARM_WATCH, PullSql
from receiver.store.sql.schema import CREATE_INDEX_WATCHES_SINCE

CREATE_WATCHES = """
CREATE TABLE watches (
    job_id           TEXT PRIMARY KEY,
    state            TEXT NOT NULL,
    since            REAL NOT NULL,
    expires_at       REAL NOT NULL,
    next_poll_at     REAL,
    last_polled_at   REAL,
    polls            INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    updated_at       REAL NOT NULL,
    lease_owner      TEXT,
    lease_expires_at REAL
) WITHOUT ROWID
"""
CREATE_INDEX_WATCHES_DUE = "CREATE INDEX watches_due ON watches (state, next_poll_at)"

CREATE_JOB_OUTCOMES = """
CREATE TABLE job_outcomes (
    key        TEXT PRIMARY KEY,
    event_id   TEXT NOT NULL,
    source     TEXT NOT NULL,
    created_at REAL NOT NULL
) WITHOUT ROWID
"""

# The migration's statements; receiver.store.sqlite.schema adds the user_version it brings.
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
    key           TEXT PRIMARY KEY,
    event_id      TEXT NOT NULL,
    upstream_time REAL,
    created_at    REAL NOT NULL
) WITHOUT ROWID
"""
BACKFILL_ASSET_LEDGER = (
    """
    INSERT OR IGNORE INTO asset_ledger (key, event_id, created_at)
    SELECT 'job ' || job_id, min(id), min(received_at) FROM events
    WHERE event = 'job.completed' AND json_valid(snapshot)
      AND json_extract(snapshot, '$.job.status') = 'completed'
    GROUP BY job_id
    """,
    """
    INSERT OR IGNORE INTO asset_ledger (key, event_id, created_at)
    SELECT 'asset ' || json_extract(a.value, '$.id'), e.id, e.received_at
    FROM events e, json_each(e.snapshot, '$.assets') a
    WHERE e.event = 'job.completed' AND json_valid(e.snapshot)
      AND json_type(a.value, '$.id') = 'text'
    """,
    """
    INSERT OR IGNORE INTO asset_ledger (key, event_id, created_at)
    SELECT 'job ' || e.job_id || ' ' || u.key, e.id, e.received_at
    FROM events e, json_each(e.snapshot, '$.job.urls') u
    WHERE e.event = 'job.completed' AND json_valid(e.snapshot)
      AND json_array_length(e.snapshot, '$.assets') = 0
    """,
)
ASSET_LEDGER_SCHEMA: tuple[str, ...] = (CREATE_ASSET_LEDGER, *BACKFILL_ASSET_LEDGER)
# Followed by one OUTCOME_ROW per outcome (.intake writes them in one go).
INSERT_OUTCOMES_HEAD = "INSERT INTO job_outcomes (key, event_id, source, created_at) VALUES "
OUTCOME_ROW = "(?, ?, ?, ?)"


class SqlitePull(PullSql):
    """The pull-mode statements as SQLite runs them."""

    MARK_FORGOTTEN = (
        "INSERT INTO asset_ledger (key, event_id, upstream_time, created_at) "
        f"VALUES ('{FORGOTTEN_BEFORE}', '', :older_than, :older_than) "
        "ON CONFLICT (key) DO UPDATE SET "
        "upstream_time = max(asset_ledger.upstream_time, excluded.upstream_time)"
    )

    # (``WHERE true``: an upsert's SELECT needs a WHERE, or its ON would be read as a join's.)
    ADD_WATCHES = (
        """
INSERT INTO watches (job_id, state, since, expires_at, next_poll_at, polls, updated_at)
SELECT value, 'watching', :now, :expires_at, :now, 0, :now FROM json_each(:ids) WHERE true
"""
        + REARM_WATCH
    )

    SELECT_WATCHES = (
        "SELECT "
        + WATCH_COLUMNS
        + " FROM watches WHERE job_id IN (SELECT value FROM json_each(:ids))"
    )

    CLAIM_WATCHES = (
        f"""
UPDATE watches SET lease_owner = :owner, lease_expires_at = :expires
WHERE job_id IN (
{DUE_WATCHES})
RETURNING """
        + WATCH_COLUMNS
    )

    KNOWN_OUTCOMES = (
        "SELECT key FROM job_outcomes WHERE key IN (SELECT value FROM json_each(:keys))"
    )

    SELECT_LEDGER = """
SELECT key, upstream_time FROM asset_ledger WHERE key IN (SELECT value FROM json_each(:keys))
"""
