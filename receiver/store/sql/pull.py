"""The watch list and the ledgers of pull mode (see :mod:`receiver.store.pull`), written once for
both SQL dialects."""

from __future__ import annotations

from typing import ClassVar

from receiver.store.asset_ledger import FORGOTTEN_BEFORE
from receiver.store.pull import WATCH_COLUMNS, WatchRecord, WatchState, next_poll, watch_records
from receiver.store.sql.conn import Conn, SqlMixin

# -- SQL both dialects run as it is -------------------------------------------------------------

# Outcomes already in the inbox when the ledger is created came by webhook.
BACKFILL_JOB_OUTCOMES = """
INSERT INTO job_outcomes (key, event_id, source, created_at)
SELECT event || ' ' || job_id, min(id), 'webhook', min(received_at) FROM events
WHERE event IN ('job.completed', 'job.failed')
GROUP BY event, job_id
"""

# The tail of adding a watch: a watch that ended expired or not_found starts again; a watch
# still watching or done stays as it is.
REARM_WATCH = """
ON CONFLICT (job_id) DO UPDATE SET
    state = 'watching', since = excluded.since, expires_at = excluded.expires_at,
    next_poll_at = excluded.next_poll_at, last_polled_at = NULL, polls = 0, last_error = NULL,
    updated_at = excluded.updated_at, lease_owner = NULL, lease_expires_at = NULL
WHERE watches.state IN ('expired', 'not_found')
"""

# The watches a poller's claim takes (pull.watch_due): watching, due, not expired, nobody
# holding them; the earliest due first (each dialect's CLAIM_WATCHES leases these).
DUE_WATCHES = """\
    SELECT job_id FROM watches
    WHERE state = 'watching' AND next_poll_at <= :now AND expires_at > :now
      AND (lease_expires_at IS NULL OR lease_expires_at < :now)
    ORDER BY next_poll_at
    LIMIT :limit
"""

WATCH_COUNTS = "SELECT state, count(*) FROM watches GROUP BY state"


SETTLE_WATCH = """
UPDATE watches SET state = :state, next_poll_at = :next_poll_at, last_polled_at = :now,
    polls = polls + 1, last_error = :error, updated_at = :now, lease_owner = NULL,
    lease_expires_at = NULL
WHERE job_id = :job_id AND lease_owner = :owner
"""

EXPIRE_WATCHES = """
UPDATE watches SET state = 'expired', updated_at = :now, lease_owner = NULL,
    lease_expires_at = NULL
WHERE state = 'watching' AND expires_at <= :now
  AND (lease_expires_at IS NULL OR lease_expires_at < :now)
"""

LIST_WATCHES = (
    "SELECT "
    + WATCH_COLUMNS
    + " FROM watches ORDER BY since DESC, job_id LIMIT :limit OFFSET :offset"
)
LIST_WATCHES_BY_STATE = (
    "SELECT " + WATCH_COLUMNS + " FROM watches WHERE state = :state "
    "ORDER BY since DESC, job_id LIMIT :limit OFFSET :offset"
)


# The ledgers' rows older than their retention, oldest first (their created_at index, schema
# version 9), except those of an event still in the inbox (a dead one is kept until redelivered
# or pruned: its outcome and assets stay taken).
PRUNE_OUTCOMES = """
DELETE FROM job_outcomes WHERE key IN (
    SELECT key FROM job_outcomes
    WHERE created_at < :older_than
      AND NOT EXISTS (SELECT 1 FROM events WHERE events.id = job_outcomes.event_id)
    ORDER BY created_at LIMIT :limit
)
"""
PRUNE_ASSET_LEDGER = f"""
DELETE FROM asset_ledger WHERE key IN (
    SELECT key FROM asset_ledger
    WHERE created_at < :older_than AND key <> '{FORGOTTEN_BEFORE}'
      AND NOT EXISTS (SELECT 1 FROM events WHERE events.id = asset_ledger.event_id)
    ORDER BY created_at LIMIT :limit
)
"""


class PullSql:
    """The pull-mode statements a dialect runs: a backend's subclass (``<backend>/pull.py``)
    sets those without a value here; those with one are the SQL both dialects run as it is.
    ``:ids`` and ``:keys`` are lists."""

    #: Watch the jobs ``:ids`` since ``:now`` until ``:expires_at`` (see pull.REARM_WATCH)...
    ADD_WATCHES: ClassVar[str]
    #: ... and read their rows (``WATCH_COLUMNS``).
    SELECT_WATCHES: ClassVar[str]
    #: Lease up to ``:limit`` watches due at ``:now`` to ``:owner`` until ``:expires``.
    CLAIM_WATCHES: ClassVar[str]
    #: Which of ``:keys`` the job-outcome ledger holds (first column: the key).
    KNOWN_OUTCOMES: ClassVar[str]
    #: The asset-ledger rows (key, upstream time) of ``:keys``.
    SELECT_LEDGER: ClassVar[str]
    SETTLE_WATCH: ClassVar[str] = SETTLE_WATCH
    EXPIRE_WATCHES: ClassVar[str] = EXPIRE_WATCHES
    LIST_WATCHES: ClassVar[str] = LIST_WATCHES
    LIST_WATCHES_BY_STATE: ClassVar[str] = LIST_WATCHES_BY_STATE
    WATCH_COUNTS: ClassVar[str] = WATCH_COUNTS
    PRUNE_OUTCOMES: ClassVar[str] = PRUNE_OUTCOMES
    PRUNE_ASSET_LEDGER: ClassVar[str] = PRUNE_ASSET_LEDGER
    #: Raise the asset ledger's FORGOTTEN_BEFORE row to ``:older_than`` (made when missing).
    MARK_FORGOTTEN: ClassVar[str]


class SqlPull(SqlMixin):
    """The :class:`~receiver.store.pull.PullStore` methods of the SQL stores."""

    _pull_sql: type[PullSql]

    async def add_watches(
        self, job_ids: list[str], *, now: float, expires_at: float
    ) -> list[WatchRecord]:
        sql = self._pull_sql
        ids = list(dict.fromkeys(job_ids))

        async def run(c: Conn) -> list[WatchRecord]:
            await c.run(sql.ADD_WATCHES, {"ids": ids, "now": now, "expires_at": expires_at})
            rows = await c.rows(sql.SELECT_WATCHES, {"ids": ids})
            by_id = {r.job_id: r for r in watch_records(rows)}
            return [by_id[j] for j in ids]

        return await self._run_write(run)

    async def claim_watches(
        self, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> list[WatchRecord]:
        if limit <= 0:
            return []
        sql = self._pull_sql
        params = {"owner": owner, "expires": now + lease_seconds, "now": now, "limit": limit}

        async def run(c: Conn) -> list[WatchRecord]:
            return watch_records(await c.rows(sql.CLAIM_WATCHES, params))

        return await self._run_write(run, durable=False)

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
        sql = self._pull_sql
        params = {
            "state": state,
            "next_poll_at": next_poll(state, now, next_poll_at),
            "now": now,
            "error": error,
            "job_id": job_id,
            "owner": owner,
        }

        async def run(c: Conn) -> None:
            await c.run(sql.SETTLE_WATCH, params)

        await self._run_write(run, transaction=False, durable=False)

    async def expire_watches(self, *, now: float) -> int:
        sql = self._pull_sql

        async def run(c: Conn) -> int:
            return await c.run(sql.EXPIRE_WATCHES, {"now": now})

        return await self._run_write(run, transaction=False, durable=False)

    async def list_watches(
        self, *, state: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[WatchRecord]:
        sql = self._pull_sql
        params = {"state": state, "limit": max(limit, 0), "offset": max(offset, 0)}
        statement = sql.LIST_WATCHES if state is None else sql.LIST_WATCHES_BY_STATE

        async def run(c: Conn) -> list[WatchRecord]:
            return watch_records(await c.rows(statement, params))

        return await self._run_read(run)

    async def watch_counts(self) -> dict[str, int]:
        sql = self._pull_sql

        async def run(c: Conn) -> dict[str, int]:
            return {row[0]: int(row[1]) for row in await c.rows(sql.WATCH_COUNTS)}

        return await self._run_read(run)

    async def known_outcomes(self, keys: list[str]) -> set[str]:
        if not keys:
            return set()
        sql = self._pull_sql

        async def run(c: Conn) -> set[str]:
            return {row[0] for row in await c.rows(sql.KNOWN_OUTCOMES, {"keys": list(keys)})}

        return await self._run_read(run)

    async def prune_ledgers_step(self, *, older_than: float, limit: int) -> int:
        sql = self._pull_sql
        params = {"older_than": older_than, "limit": max(limit, 1)}

        async def run(c: Conn) -> int:
            forgotten = await c.run(sql.PRUNE_OUTCOMES, params)
            forgotten += await c.run(sql.PRUNE_ASSET_LEDGER, params)
            if forgotten:  # in the same transaction: never a row forgotten unmarked
                await c.run(sql.MARK_FORGOTTEN, {"older_than": older_than})
            return forgotten

        return await self._run_write(run, durable=False)

    async def ledger(self, keys: list[str]) -> dict[str, float | None]:
        if not keys:
            return {}
        sql = self._pull_sql

        async def run(c: Conn) -> dict[str, float | None]:
            return {row[0]: row[1] for row in await c.rows(sql.SELECT_LEDGER, {"keys": list(keys)})}

        return await self._run_read(run)
