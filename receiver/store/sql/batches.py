"""Redelivery batches and lane pauses, written once for both SQL dialects (the model is
:mod:`receiver.store.batches`).

A filter becomes fixed ``WHERE`` fragments with named parameters joined as it needs them
(:func:`where`): no value is ever put into SQL text. A step runs in one short transaction:
its batch's row (locked, and skipped if another replica is stepping it, where writers lock
rows), the next events after the cursor (at most ``limit``, from the index the filter allows),
their rows locked in id order as every other writer locks them, then their matching deliveries
made pending, due now and marked with the batch, each keeping what it was before. A cancel
stops the batch and withdraws what no lane has started to send (:mod:`receiver.store.sql.
withdraw`); closing a cancelled batch withdraws what an attempt in flight then left waiting for
a retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from receiver.store import batches as model
from receiver.store.batches import (
    BATCH_COLUMNS,
    MatchedDelivery,
    Progress,
    RedeliveryBatch,
    RedeliveryFilter,
    RedeliveryPreview,
)
from receiver.store.lanes_model import LanePause, LanePolicy, LaneState
from receiver.store.records import delivery_record
from receiver.store.sql.conn import Conn
from receiver.store.sql.lanes import LaneSql, lane_state
from receiver.store.sql.records import recompute
from receiver.store.sql.withdraw import SqlWithdrawals, WithdrawSql, any_withdrawable

# -- SQL both dialects run as it is -------------------------------------------------------------

INSERT_BATCH = """
INSERT INTO redeliveries (id, filter, created_by, created_at, state, matched, queued)
VALUES (:id, :filter, :created_by, :created_at, 'running', :matched, 0)
"""
SELECT_BATCH = "SELECT " + BATCH_COLUMNS + " FROM redeliveries WHERE id = :id"
LIST_BATCHES = (
    "SELECT " + BATCH_COLUMNS + " FROM redeliveries ORDER BY created_at DESC, id DESC LIMIT :limit"
)
QUEUING = "SELECT id FROM redeliveries WHERE state = 'running' AND queued_at IS NULL"
# Queued (or cancelled), some deliveries maybe still pending: what finish() looks at.
UNFINISHED = (
    "SELECT " + BATCH_COLUMNS + " FROM redeliveries"
    " WHERE finished_at IS NULL AND (queued_at IS NOT NULL OR state = 'cancelled')"
)
# Served by the partial index deliveries_batch (batch_id, state).
PROGRESS = "SELECT state, count(*) FROM deliveries WHERE batch_id = :id GROUP BY state"
ANY_PENDING = "SELECT 1 FROM deliveries WHERE batch_id = :id AND state = 'pending' LIMIT 1"
SAVE_STEP = """
UPDATE redeliveries SET queued = :queued, cursor = :cursor, matched = :matched,
    queued_at = :queued_at
WHERE id = :id
"""
# A running batch becomes done; a cancelled one stays cancelled (see batches.finished).
FINISH = """
UPDATE redeliveries SET state = CASE state WHEN 'running' THEN 'done' ELSE state END,
    finished_at = :now, delivered = :delivered, failed = :failed, skipped = :skipped
WHERE id = :id AND finished_at IS NULL
"""

# The next events a step looks at, after the cursor in id order: one event; one job's (the
# events_job index); those with a dead delivery (the partial index on dead rows); or any.
NEXT_EVENT = "SELECT id FROM events WHERE id = :event_id AND id > :after"
NEXT_OF_JOB = (
    "SELECT id FROM events WHERE job_id = :job_id AND id > :after ORDER BY id LIMIT :limit"
)
NEXT_DEAD = """
SELECT DISTINCT event_id FROM deliveries WHERE state = 'dead' AND event_id > :after
ORDER BY event_id LIMIT :limit
"""
NEXT_ANY = "SELECT id FROM events WHERE id > :after ORDER BY id LIMIT :limit"

# What a delivery must be (the delivery half of the filter).
STATUS = {
    "dead": "d.state = 'dead'",
    "done": "d.state = 'done'",
    "pending": "d.state = 'pending'",
    "failed": "d.state = 'pending' AND d.last_error IS NOT NULL",
    "any": "d.state != 'skipped'",
}
NOT_LEASED = "(d.lease_expires_at IS NULL OR d.lease_expires_at < :now)"
WHERE_ERROR = "d.last_error = :error"
WHERE_EVENT_ID = "d.event_id = :event_id"
WHERE_JOB = "d.event_id IN (SELECT id FROM events WHERE job_id = :job_id)"
# The event half, when it names more than the event or its job.
EVENT_NAME = "e.event = :event"
EVENT_SINCE = "e.received_at >= :since"
EVENT_UNTIL = "e.received_at < :until"

# (``before_batch`` is computed from the row as it was before this UPDATE.)
REDELIVER = """
UPDATE deliveries AS d
SET state = 'pending', attempts = 0, next_attempt_at = :now, last_error = NULL, updated_at = :now,
    batch_id = :batch_id, before_batch = {snapshot}
WHERE {where}
RETURNING event_id
"""
COUNT = "SELECT count(*) FROM deliveries d WHERE {where}"
SAMPLE = """
SELECT d.event_id, d.sink, d.state, d.attempts, d.next_attempt_at, d.last_error, d.updated_at,
       d.lease_expires_at, e.event, e.received_at
FROM deliveries d JOIN events e ON e.id = d.event_id
WHERE {where}
ORDER BY d.event_id, d.sink LIMIT :sample
"""

# Lane pauses: only these write the lane's hold_* columns. A lane never seen gets its row.
PAUSE_LANE = """
UPDATE lanes SET hold_since = :since, hold_until = :until, hold_reason = :reason WHERE sink = :sink
"""
RESUME_LANE = """
UPDATE lanes SET hold_since = NULL, hold_until = NULL, hold_reason = NULL WHERE sink = :sink
"""
LANE_ROWS = """
SELECT sink, tokens, refilled_at, paused_until, failures, opened_at, hold_since, hold_until,
       hold_reason
FROM lanes ORDER BY sink
"""


class BatchSql(WithdrawSql):
    """The batch statements a dialect runs: a backend's subclass (``<backend>/batches.py``)
    sets those without a value here (and those of withdrawing, :class:`WithdrawSql`). ``:ids``
    is a list of event ids, ``:sinks`` of sinks."""

    LANES: ClassVar[type[LaneSql]]
    #: ``d.event_id`` is in ``:ids``; ``d.sink`` is in ``:sinks``.
    IN_IDS: ClassVar[str]
    IN_SINKS: ClassVar[str]
    #: Events of ``:ids`` without a snapshot are fetched again first (due ``:now``).
    REENRICH: ClassVar[str]


def where(flt: RedeliveryFilter, sql: type[BatchSql], *, ids: bool = False) -> str:
    """The ``WHERE`` of the deliveries ``flt`` selects (among the events ``:ids``)."""
    clauses = [STATUS[flt.status], "d.state != 'skipped'", NOT_LEASED]
    if ids:
        clauses.insert(0, sql.IN_IDS)
    if flt.event_id is not None:
        clauses.append(WHERE_EVENT_ID)
    if flt.job_id is not None:
        clauses.append(WHERE_JOB)
    if flt.sinks:
        clauses.append(sql.IN_SINKS)
    if flt.error is not None:
        clauses.append(WHERE_ERROR)
    events = [
        clause
        for clause, value in (
            (EVENT_NAME, flt.event),
            (EVENT_SINCE, flt.since),
            (EVENT_UNTIL, flt.until),
        )
        if value is not None
    ]
    if events:
        clauses.append(
            "d.event_id IN (SELECT e.id FROM events e WHERE " + " AND ".join(events) + ")"
        )
    return " AND ".join(clauses)


def params(flt: RedeliveryFilter, now: float, **more: Any) -> dict[str, Any]:
    """The named parameters of every statement :func:`where` makes."""
    return {
        "now": now,
        "event_id": flt.event_id,
        "job_id": flt.job_id,
        "sinks": list(flt.sinks),
        "error": flt.error,
        "event": flt.event,
        "since": flt.since,
        "until": flt.until,
        **more,
    }


def next_events(flt: RedeliveryFilter) -> str:
    """The statement that finds a step's events (see ``NEXT_*``)."""
    if flt.event_id is not None:
        return NEXT_EVENT
    if flt.job_id is not None:
        return NEXT_OF_JOB
    return NEXT_DEAD if flt.status == "dead" else NEXT_ANY


async def _progress(c: Conn, batch_id: str) -> Progress:
    return model.progress_of(await c.rows(PROGRESS, {"id": batch_id}))


async def _batch(c: Conn, row: Sequence[Any] | None) -> RedeliveryBatch | None:
    if row is None:
        return None
    live = None if row[9] is not None else await _progress(c, row[0])
    return model.batch_record(row, live)


class SqlBatches(SqlWithdrawals):
    """Redelivery batches and lane pauses of the SQL stores (cancelling one:
    :class:`SqlWithdrawals`)."""

    #: The dialect's statements, set by each store class.
    _batch_sql: type[BatchSql]

    async def preview_redelivery(
        self, flt: RedeliveryFilter, *, now: float, sample: int = 5
    ) -> RedeliveryPreview:
        sql = self._batch_sql
        args = params(flt, now, sample=max(sample, 0))
        text = where(flt, sql)

        async def run(c: Conn) -> RedeliveryPreview:
            matched = int(await c.value(COUNT.format(where=text), args) or 0)
            rows = await c.rows(SAMPLE.format(where=text), args) if sample > 0 else []
            found = tuple(MatchedDelivery(delivery_record(r[:8]), r[8], r[9]) for r in rows)
            return RedeliveryPreview(matched, found)

        return await self._run_read(run, snapshot=True)

    async def create_redelivery(
        self, flt: RedeliveryFilter, *, batch_id: str, created_by: str, now: float
    ) -> RedeliveryBatch:
        matched = (await self.preview_redelivery(flt, now=now, sample=0)).matched
        values = {
            "id": batch_id,
            "filter": flt.to_text(),
            "created_by": created_by,
            "created_at": now,
            "matched": matched,
        }

        async def run(c: Conn) -> None:
            await c.run(INSERT_BATCH, values)

        await self._run_write(run, transaction=False)
        return RedeliveryBatch(batch_id, flt, created_by, now, "running", matched)

    async def step_redelivery(self, batch_id: str, *, limit: int, now: float) -> int | None:
        sql = self._batch_sql

        async def run(c: Conn) -> int | None:
            row = await c.row(sql.LOCK_BATCH, {"id": batch_id})
            batch = model.batch_record(row) if row is not None else None
            if batch is None or not batch.queuing:
                return None  # unknown, being stepped elsewhere, cancelled or queued
            flt = batch.filter
            args = params(flt, now, after=batch.cursor or "", limit=max(limit, 1))
            ids = [row[0] for row in await c.rows(next_events(flt), args)]
            count = 0
            if ids:
                if sql.RECORDS.LOCKS_ROWS:
                    await c.rows(sql.LOCK_EVENTS, {"ids": ids})
                statement = REDELIVER.format(where=where(flt, sql, ids=True), snapshot=sql.SNAPSHOT)
                rows = await c.rows(statement, {**args, "ids": ids, "batch_id": batch_id})
                count = len(rows)
                if count:
                    touched = sorted({row[0] for row in rows})
                    await c.run(sql.REENRICH, {"now": now, "ids": touched})
                    await recompute(c, sql.RECORDS, touched)
                    await c.notify()  # every replica's lanes look now
            last = len(ids) < max(limit, 1)
            after = model.after_step(
                batch, cursor=ids[-1] if ids else None, queued=count, last=last, now=now
            )
            await c.run(
                SAVE_STEP,
                {
                    "id": batch_id,
                    "queued": after.queued,
                    "cursor": after.cursor,
                    "matched": after.matched,
                    "queued_at": after.queued_at,
                },
            )
            return count

        return await self._run_write(run, durable=False)

    async def finish_redeliveries(self, *, now: float) -> list[str]:
        sql = self._batch_sql

        async def look(c: Conn) -> list[tuple[str, bool]]:
            found = []
            for row in await c.rows(UNFINISHED):
                sweep = row[4] == "cancelled" and await any_withdrawable(c, sql, row[0], now)
                if sweep or await c.row(ANY_PENDING, {"id": row[0]}) is None:
                    found.append((row[0], sweep))
            return found

        # Looked for in a read first: most of the time there is nothing to write.
        candidates = await self._run_read(look)
        for batch_id, sweep in candidates:
            if sweep:  # what a send in flight at the cancel left waiting for a retry
                await self._withdraw_rest(batch_id, now, wait=False)

        async def run(c: Conn) -> list[str]:
            done = []
            for batch_id, _sweep in candidates:
                if await c.row(ANY_PENDING, {"id": batch_id}) is not None:
                    continue
                p = await _progress(c, batch_id)
                values = {"id": batch_id, "now": now, "delivered": p.delivered}
                values.update(failed=p.failed, skipped=p.skipped)
                if await c.run(FINISH, values):
                    done.append(batch_id)
            return done

        return await self._run_write(run, durable=False) if candidates else []

    async def queuing_redeliveries(self) -> list[str]:
        async def run(c: Conn) -> list[str]:
            return [row[0] for row in await c.rows(QUEUING)]

        return await self._run_read(run)

    async def redelivery(self, batch_id: str) -> RedeliveryBatch | None:
        async def run(c: Conn) -> RedeliveryBatch | None:
            return await _batch(c, await c.row(SELECT_BATCH, {"id": batch_id}))

        return await self._run_read(run, snapshot=True)

    async def redeliveries(self, *, limit: int = 50) -> list[RedeliveryBatch]:
        async def run(c: Conn) -> list[RedeliveryBatch]:
            found = []
            for row in await c.rows(LIST_BATCHES, {"limit": max(limit, 0)}):
                batch = await _batch(c, row)
                assert batch is not None
                found.append(batch)
            return found

        return await self._run_read(run, snapshot=True)

    # -- lane pauses ----------------------------------------------------------------------------

    async def pause_lane(
        self, sink: str, *, until: float | None, reason: str | None, now: float
    ) -> LanePause:
        lanes = self._batch_sql.LANES

        async def run(c: Conn) -> LanePause:
            held = (await lane_state(c, lanes, LanePolicy(sink=sink), now)).pause(now)
            pause = LanePause(held.since if held is not None else now, until, reason)
            values = {"sink": sink, "since": pause.since, "until": until, "reason": reason}
            await c.run(PAUSE_LANE, values)
            return pause

        return await self._run_write(run)

    async def resume_lane(self, sink: str, *, now: float) -> LanePause | None:
        lanes = self._batch_sql.LANES

        async def run(c: Conn) -> LanePause | None:
            held = (await lane_state(c, lanes, LanePolicy(sink=sink), now)).pause(now)
            await c.run(RESUME_LANE, {"sink": sink})
            await c.notify()  # its deliveries may be claimed at once, on every replica
            return held

        return await self._run_write(run)

    async def lane_states(self) -> dict[str, LaneState]:
        async def run(c: Conn) -> dict[str, LaneState]:
            return {row[0]: LaneState(*row[1:]) for row in await c.rows(LANE_ROWS)}

        return await self._run_read(run)
