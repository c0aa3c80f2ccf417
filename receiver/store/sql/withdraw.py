"""Withdrawing what a cancelled redelivery batch queued and no lane has started to send, in
both SQL dialects (the rules are in :mod:`receiver.store.batches`).

A step keeps, in each delivery it queues, what that delivery was before (``before_batch``, a
JSON object the dialect's ``SNAPSHOT`` writes from the row as it was): the batch it was taken
for (``batch``), ``state``, ``attempts``, ``next_attempt_at``, ``last_error``, ``updated_at``,
the batch that had the delivery (``batch_id``), that batch's own ``before`` when the delivery
was pending in it, and, when the step had the event's job fetched again, the event's
enrichment (``event``: ``enrich_at``, ``enrich_attempts``, ``enrich_error``).

:func:`withdraw` runs inside the transaction of the cancel, then of each of its further
transactions for a large batch, or of the sweep that closes a cancelled batch: the batch's
deliveries still pending, not leased, and kept for this batch are put back as they were (about
``limit`` at a time, with the rest of their events'), their events' states computed again, and
an event left without anything pending gets its enrichment back too (so its job is not fetched
for nothing). Where writers lock rows, the batch's row is locked by the caller first, then the
events in id order, as a step does. Until all are back, a lane's claim passes over them (each
dialect's ``CLAIM_DELIVERIES``, with the same test as ``WITHDRAWABLE``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from receiver.store.batches import WITHDRAW_DELIVERIES, RedeliveryBatch, UnknownBatch
from receiver.store.sql.conn import Conn, SqlMixin
from receiver.store.sql.records import RecordSql, recompute

# The events of ``:limit`` deliveries to withdraw at most (in no order, not even distinct:
# sorting or grouping every one of a large batch's, for each transaction, would cost more than
# the rest). The partial index deliveries_batch (batch_id, state) finds them.
WITHDRAWABLE_EVENTS = """
SELECT d.event_id FROM deliveries d WHERE d.batch_id = :id AND {withdrawable} LIMIT :limit
"""
ANY_WITHDRAWABLE = "SELECT 1 FROM deliveries d WHERE d.batch_id = :id AND {withdrawable} LIMIT 1"
# An event gets its enrichment back only while nothing of it is pending (nothing waits for its
# job) and no fetch of it is under way.
RESTORE_ENRICHMENT = """
UPDATE events SET enrich_at = :enrich_at, enrich_attempts = :enrich_attempts,
    enrich_error = :enrich_error
WHERE id = :event_id AND fetched_at IS NULL
  AND (lease_expires_at IS NULL OR lease_expires_at < :now)
  AND NOT EXISTS (SELECT 1 FROM deliveries WHERE event_id = :event_id AND state = 'pending')
"""
ADD_WITHDRAWN = "UPDATE redeliveries SET withdrawn = withdrawn + :count WHERE id = :id"
CANCEL_RUNNING = """
UPDATE redeliveries SET state = 'cancelled', cancelled_at = :now
WHERE id = :id AND state = 'running'
"""


class WithdrawSql:
    """The statements a dialect writes for keeping and restoring a delivery's state before a
    batch (set by the backend's batch statements, ``<backend>/batches.py``)."""

    RECORDS: ClassVar[type[RecordSql]]
    #: The events ``:ids`` locked in id order (where writers lock rows).
    LOCK_EVENTS: ClassVar[str]
    #: The value of ``before_batch`` as the step ``:batch_id`` queues the row ``d``.
    SNAPSHOT: ClassVar[str]
    #: The row ``d`` may be withdrawn: pending, not leased at ``:now``, kept for its batch.
    WITHDRAWABLE: ClassVar[str]
    #: ``event_id, enrich_at, enrich_attempts, enrich_error`` kept with the withdrawable
    #: deliveries of batch ``:id`` among the events ``:ids`` whose job is still unfetched.
    KEPT_ENRICHMENT: ClassVar[str]
    #: Put the withdrawable deliveries of batch ``:id`` among the events ``:ids`` back as kept,
    #: returning each one's ``event_id``.
    RESTORE_DELIVERIES: ClassVar[str]
    #: The batch ``:id`` (``BATCH_COLUMNS``), locked until the transaction ends where writers
    #: lock rows: ``LOCK_BATCH`` skips it (no row) while another holds it, ``LOCK_BATCH_WAIT``
    #: waits for it (for a step under way).
    LOCK_BATCH: ClassVar[str]
    LOCK_BATCH_WAIT: ClassVar[str]


async def any_withdrawable(c: Conn, sql: type[WithdrawSql], batch_id: str, now: float) -> bool:
    """Whether the batch has a delivery :func:`withdraw` would put back."""
    query = ANY_WITHDRAWABLE.format(withdrawable=sql.WITHDRAWABLE)
    return await c.row(query, {"id": batch_id, "now": now}) is not None


async def withdraw(
    c: Conn, sql: type[WithdrawSql], batch_id: str, now: float, limit: int
) -> tuple[int, bool]:
    """Put back as they were before the batch the deliveries of it still pending and not
    leased at ``now``, of the events of ``limit`` of them at most (all of each event's: a few
    more); add them to its ``withdrawn`` count.
    How many, and whether more may remain. The caller holds the batch's row (where writers
    lock rows)."""
    args: dict[str, Any] = {"id": batch_id, "now": now, "limit": max(limit, 1)}
    query = WITHDRAWABLE_EVENTS.format(withdrawable=sql.WITHDRAWABLE)
    found = await c.rows(query, args)
    more = len(found) >= max(limit, 1)
    ids = sorted({row[0] for row in found})  # the order writers lock them in
    if not ids:
        return 0, False
    if sql.RECORDS.LOCKS_ROWS:
        await c.rows(sql.LOCK_EVENTS, {"ids": ids})
    args["ids"] = ids
    # Read before the rows are put back, which drops what was kept with them.
    kept = {row[0]: row[1:] for row in await c.rows(sql.KEPT_ENRICHMENT, args)}
    rows = await c.rows(sql.RESTORE_DELIVERIES, args)
    if not rows:
        return 0, False  # taken meanwhile (no step forward: looking again would not be either)
    touched = sorted({row[0] for row in rows})
    await recompute(c, sql.RECORDS, touched)
    for event_id, (enrich_at, attempts, error) in sorted(kept.items()):
        values = {"event_id": event_id, "now": now, "enrich_at": enrich_at}
        values.update(enrich_attempts=attempts or 0, enrich_error=error)
        await c.run(RESTORE_ENRICHMENT, values)
    await c.run(ADD_WITHDRAWN, {"id": batch_id, "count": len(rows)})
    return len(rows), more


class SqlWithdrawals(SqlMixin):
    """Cancelling a redelivery batch in the SQL stores (part of their batches)."""

    #: The dialect's statements, set by each store class.
    _batch_sql: type[WithdrawSql]

    if TYPE_CHECKING:

        async def redelivery(self, batch_id: str) -> RedeliveryBatch | None: ...

    async def cancel_redelivery(self, batch_id: str, *, now: float) -> RedeliveryBatch:
        sql = self._batch_sql

        async def run(c: Conn) -> bool:
            # The batch's row first, waiting for a step under way: what it queues is withdrawn.
            row = await c.row(sql.LOCK_BATCH_WAIT, {"id": batch_id})
            if row is None:
                raise UnknownBatch(batch_id)
            if row[9] is not None:
                return False  # finished: done, or cancelled and closed; nothing of it pending
            if row[4] == "running":
                await c.run(CANCEL_RUNNING, {"id": batch_id, "now": now})
            return (await withdraw(c, sql, batch_id, now, WITHDRAW_DELIVERIES))[1]

        if await self._run_write(run):
            await self._withdraw_rest(batch_id, now, wait=True)
        batch = await self.redelivery(batch_id)
        if batch is None:
            raise UnknownBatch(batch_id)
        return batch

    async def _withdraw_rest(self, batch_id: str, now: float, *, wait: bool) -> None:
        """Withdraw what remains of a cancelled batch, in transactions of
        :data:`WITHDRAW_DELIVERIES` deliveries (other writers, intake first, go between them). The
        batch's row is locked first in each, as a cancel and a step lock it; ``wait`` False
        leaves the batch to another replica holding it."""
        sql = self._batch_sql
        lock = sql.LOCK_BATCH_WAIT if wait else sql.LOCK_BATCH

        async def run(c: Conn) -> bool:
            row = await c.row(lock, {"id": batch_id})
            if row is None or row[4] != "cancelled" or row[9] is not None:
                return False
            return (await withdraw(c, sql, batch_id, now, WITHDRAW_DELIVERIES))[1]

        more = True
        while more:  # each transaction a writer's turn of its own: others queue between
            more = await self._run_write(run, durable=False)
