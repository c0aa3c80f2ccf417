"""The SQLite inbox's pull-mode tables and queries (see :mod:`receiver.store.pull`).

Kept apart from :mod:`receiver.store.sqlite`: the watch list and the job-outcome ledger have
their own tables (:data:`PULL_SCHEMA`, one migration) and their own statements. Only the
outcome check inside ``add_event`` lives with the event inserts
(:mod:`receiver.store.sqlite.intake`).
"""

from __future__ import annotations

import json

import aiosqlite

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
from receiver.store.sqlite.mixin import SqliteMixin

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
CREATE_INDEX_WATCHES_SINCE = "CREATE INDEX watches_since ON watches (since)"

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
# One ledger entry; an item's entry keeps the latest upstream time it was taken at.
RECORD_ASSET = """
INSERT INTO asset_ledger (key, event_id, upstream_time, created_at) VALUES (?, ?, ?, ?)
ON CONFLICT (key) DO UPDATE SET upstream_time = max(
    coalesce(asset_ledger.upstream_time, excluded.upstream_time),
    coalesce(excluded.upstream_time, asset_ledger.upstream_time))
"""
SELECT_LEDGER = """
SELECT key, upstream_time FROM asset_ledger WHERE key IN (SELECT value FROM json_each(?))
"""

# Which of a list of outcome keys the ledger holds, and from which source.
SELECT_OUTCOMES = """
SELECT key, source FROM job_outcomes WHERE key IN (SELECT value FROM json_each(?))
"""
# Followed by one OUTCOME_ROW per outcome (receiver.store.sqlite.intake writes them in one go).
INSERT_OUTCOMES_HEAD = "INSERT INTO job_outcomes (key, event_id, source, created_at) VALUES "
OUTCOME_ROW = "(?, ?, ?, ?)"

ADD_WATCH = (
    """
INSERT INTO watches (job_id, state, since, expires_at, next_poll_at, polls, updated_at)
VALUES (?, 'watching', ?, ?, ?, 0, ?)
"""
    + REARM_WATCH
)
SELECT_WATCHES = (
    "SELECT " + WATCH_COLUMNS + " FROM watches WHERE job_id IN (SELECT value FROM json_each(?))"
)

CLAIM_WATCHES = (
    """
UPDATE watches SET lease_owner = :owner, lease_expires_at = :expires
WHERE job_id IN (
    SELECT job_id FROM watches
    WHERE state = 'watching' AND next_poll_at <= :now AND expires_at > :now
      AND (lease_expires_at IS NULL OR lease_expires_at < :now)
    ORDER BY next_poll_at
    LIMIT :limit
)
RETURNING """
    + WATCH_COLUMNS
)

SETTLE_WATCH = """
UPDATE watches SET state = ?, next_poll_at = ?, last_polled_at = ?, polls = polls + 1,
    last_error = ?, updated_at = ?, lease_owner = NULL, lease_expires_at = NULL
WHERE job_id = ? AND lease_owner = ?
"""

EXPIRE_WATCHES = """
UPDATE watches SET state = 'expired', updated_at = :now, lease_owner = NULL,
    lease_expires_at = NULL
WHERE state = 'watching' AND expires_at <= :now
  AND (lease_expires_at IS NULL OR lease_expires_at < :now)
"""

LIST_WATCHES = (
    "SELECT " + WATCH_COLUMNS + " FROM watches ORDER BY since DESC, job_id LIMIT ? OFFSET ?"
)
LIST_WATCHES_BY_STATE = (
    "SELECT " + WATCH_COLUMNS + " FROM watches WHERE state = ? "
    "ORDER BY since DESC, job_id LIMIT ? OFFSET ?"
)


class SqlitePull(SqliteMixin):
    """The :class:`~receiver.store.pull.PullStore` methods of the SQLite store (a mixin)."""

    async def add_watches(
        self, job_ids: list[str], *, now: float, expires_at: float
    ) -> list[WatchRecord]:
        ids = list(dict.fromkeys(job_ids))

        async def run(conn: aiosqlite.Connection) -> list[WatchRecord]:
            await conn.executemany(ADD_WATCH, [(j, now, expires_at, now, now) for j in ids])
            rows = await conn.execute_fetchall(SELECT_WATCHES, (json.dumps(ids),))
            by_id = {r.job_id: r for r in watch_records(rows)}
            return [by_id[j] for j in ids]

        return await self._write_tx(run)

    async def claim_watches(
        self, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> list[WatchRecord]:
        if limit <= 0:
            return []
        params = {"owner": owner, "expires": now + lease_seconds, "now": now, "limit": limit}

        async def run(conn: aiosqlite.Connection) -> list[WatchRecord]:
            return watch_records(await conn.execute_fetchall(CLAIM_WATCHES, params))

        return await self._write_tx(run)

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
        params = (state, nxt, now, error, now, job_id, owner)
        await self._write_tx(lambda conn: conn.execute(SETTLE_WATCH, params))

    async def expire_watches(self, *, now: float) -> int:
        async def run(conn: aiosqlite.Connection) -> int:
            return int((await conn.execute(EXPIRE_WATCHES, {"now": now})).rowcount)

        return await self._write_tx(run)

    async def list_watches(
        self, *, state: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[WatchRecord]:
        limit, offset = max(limit, 0), max(offset, 0)

        async def run(conn: aiosqlite.Connection) -> list[WatchRecord]:
            if state is None:
                return watch_records(await conn.execute_fetchall(LIST_WATCHES, (limit, offset)))
            params = (state, limit, offset)
            return watch_records(await conn.execute_fetchall(LIST_WATCHES_BY_STATE, params))

        return await self._read_tx(run)

    async def watch_counts(self) -> dict[str, int]:
        async def run(conn: aiosqlite.Connection) -> dict[str, int]:
            return {row[0]: int(row[1]) for row in await conn.execute_fetchall(WATCH_COUNTS)}

        return await self._read_tx(run)

    async def known_outcomes(self, keys: list[str]) -> set[str]:
        if not keys:
            return set()

        async def run(conn: aiosqlite.Connection) -> set[str]:
            rows = await conn.execute_fetchall(SELECT_OUTCOMES, (json.dumps(keys),))
            return {row[0] for row in rows}

        return await self._read_tx(run)

    async def ledger(self, keys: list[str]) -> dict[str, float | None]:
        if not keys:
            return {}

        async def run(conn: aiosqlite.Connection) -> dict[str, float | None]:
            rows = await conn.execute_fetchall(SELECT_LEDGER, (json.dumps(keys),))
            return {row[0]: row[1] for row in rows}

        return await self._read_tx(run)
