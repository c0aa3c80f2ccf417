"""The Postgres inbox's pull-mode tables and queries (see :mod:`receiver.store.pull`).

Kept apart from :mod:`receiver.store.postgres`: the watch list and the job-outcome ledger have
their own tables (:data:`PULL_SCHEMA`, one migration) and statements. Watch claims lock rows
with ``FOR UPDATE SKIP LOCKED`` and lease them, so replicas sharing the inbox never poll one job
at the same time. The outcome check of ``add_event`` is part of the group commit in
:mod:`receiver.store.postgres`.
"""

from __future__ import annotations

from typing import Any

from receiver.store.postgres.mixin import PostgresMixin
from receiver.store.pull import (
    BACKFILL_JOB_OUTCOMES,
    REARM_WATCH,
    WATCH_COLUMNS,
    WATCH_COUNTS,
    WatchRecord,
    WatchState,
    next_poll,
    watch_records,
)

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
CREATE_INDEX_WATCHES_SINCE = "CREATE INDEX watches_since ON watches (since)"
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

ADD_WATCHES = (
    """
INSERT INTO watches (job_id, state, since, expires_at, next_poll_at, polls, updated_at)
SELECT j, 'watching', $2, $3, $2, 0, $2 FROM unnest($1::text[]) AS j
"""
    + REARM_WATCH
)
SELECT_WATCHES = "SELECT " + WATCH_COLUMNS + " FROM watches WHERE job_id = ANY($1::text[])"

CLAIM_WATCHES = """
WITH due AS (
    SELECT job_id FROM watches
    WHERE state = 'watching' AND next_poll_at <= $1 AND expires_at > $1
      AND (lease_expires_at IS NULL OR lease_expires_at < $1)
    ORDER BY next_poll_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE watches w SET lease_owner = $3, lease_expires_at = $4
FROM due WHERE w.job_id = due.job_id
RETURNING w.job_id, w.state, w.since, w.expires_at, w.last_polled_at, w.polls, w.last_error,
          w.updated_at
"""

SETTLE_WATCH = """
UPDATE watches SET state = $1, next_poll_at = $2, last_polled_at = $3, polls = polls + 1,
    last_error = $4, updated_at = $3, lease_owner = NULL, lease_expires_at = NULL
WHERE job_id = $5 AND lease_owner = $6
"""

EXPIRE_WATCHES = """
UPDATE watches SET state = 'expired', updated_at = $1, lease_owner = NULL, lease_expires_at = NULL
WHERE state = 'watching' AND expires_at <= $1
  AND (lease_expires_at IS NULL OR lease_expires_at < $1)
"""

LIST_WATCHES = (
    "SELECT " + WATCH_COLUMNS + " FROM watches ORDER BY since DESC, job_id LIMIT $1 OFFSET $2"
)
LIST_WATCHES_BY_STATE = (
    "SELECT " + WATCH_COLUMNS + " FROM watches WHERE state = $1 "
    "ORDER BY since DESC, job_id LIMIT $2 OFFSET $3"
)
KNOWN_OUTCOMES = "SELECT key FROM job_outcomes WHERE key = ANY($1::text[])"

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
# A snapshot's ledger entries (arrays of columns); an item's entry keeps the latest upstream
# time it was taken at.
RECORD_ASSETS = """
INSERT INTO asset_ledger (key, event_id, upstream_time, created_at)
SELECT k, $2, t, $4 FROM unnest($1::text[], $3::double precision[]) AS r (k, t)
ON CONFLICT (key) DO UPDATE SET
    upstream_time = greatest(asset_ledger.upstream_time, excluded.upstream_time)
"""
SELECT_LEDGER = "SELECT key, upstream_time FROM asset_ledger WHERE key = ANY($1::text[])"


def command_count(status: str) -> int:
    """The row count of a command status such as ``UPDATE 3``."""
    tail = status.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0


class PostgresPull(PostgresMixin):
    """The :class:`~receiver.store.pull.PullStore` methods of the Postgres store (a mixin)."""

    async def add_watches(
        self, job_ids: list[str], *, now: float, expires_at: float
    ) -> list[WatchRecord]:
        ids = list(dict.fromkeys(job_ids))

        async def run(conn: Any) -> list[WatchRecord]:
            await conn.execute(ADD_WATCHES, ids, now, expires_at)
            by_id = {r.job_id: r for r in watch_records(await conn.fetch(SELECT_WATCHES, ids))}
            return [by_id[j] for j in ids]

        return await self._run(run, transaction=True)

    async def claim_watches(
        self, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> list[WatchRecord]:
        if limit <= 0:
            return []

        async def run(conn: Any) -> list[WatchRecord]:
            rows = await conn.fetch(CLAIM_WATCHES, now, limit, owner, now + lease_seconds)
            return watch_records(rows)

        return await self._run(run, transaction=True)

    async def settle_watch(
        self,
        job_id: str,
        *,
        owner: str,
        state: WatchState,
        now: float,
        next_poll_at: float | None = None,
        error: str | None = None,
    ) -> None:
        nxt = next_poll(state, now, next_poll_at)

        async def run(conn: Any) -> None:
            await conn.execute(SETTLE_WATCH, state, nxt, now, error, job_id, owner)

        await self._run(run)

    async def expire_watches(self, *, now: float) -> int:
        async def run(conn: Any) -> int:
            return command_count(await conn.execute(EXPIRE_WATCHES, now))

        return await self._run(run)

    async def list_watches(
        self, *, state: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[WatchRecord]:
        limit, offset = max(limit, 0), max(offset, 0)

        async def run(conn: Any) -> list[WatchRecord]:
            if state is None:
                return watch_records(await conn.fetch(LIST_WATCHES, limit, offset))
            return watch_records(await conn.fetch(LIST_WATCHES_BY_STATE, state, limit, offset))

        return await self._run(run)

    async def watch_counts(self) -> dict[str, int]:
        async def run(conn: Any) -> dict[str, int]:
            return {row[0]: int(row[1]) for row in await conn.fetch(WATCH_COUNTS)}

        return await self._run(run)

    async def known_outcomes(self, keys: list[str]) -> set[str]:
        if not keys:
            return set()

        async def run(conn: Any) -> set[str]:
            return {row[0] for row in await conn.fetch(KNOWN_OUTCOMES, list(keys))}

        return await self._run(run)

    async def ledger(self, keys: list[str]) -> dict[str, float | None]:
        if not keys:
            return {}

        async def run(conn: Any) -> dict[str, float | None]:
            return {row[0]: row[1] for row in await conn.fetch(SELECT_LEDGER, list(keys))}

        return await self._run(run)
