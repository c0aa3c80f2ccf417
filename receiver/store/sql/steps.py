"""An event's steps (its timeline, :mod:`receiver.store.steps`) in both SQL dialects: written
inside the transaction of the result they belong to, the newest kept per delivery."""

from __future__ import annotations

from collections.abc import Sequence

from receiver.store.sql.conn import Conn, SqlMixin
from receiver.store.steps import (
    MAX_STEPS_PER_DELIVERY,
    STEP_COLUMNS,
    Step,
    bounded,
    in_order,
    step_record,
)

INSERT_STEP = """
INSERT INTO event_steps (event_id, sink, kind, name, attempt, started_at, ended_at, outcome,
    error, status)
VALUES (:event_id, :sink, :kind, :name, :attempt, :started_at, :ended_at, :outcome, :error,
    :status)
"""

# Served by event_steps_event (event_id, sink, seq): the keep-th newest step of the delivery,
# and everything up to it.
TRIM_STEPS = """
DELETE FROM event_steps WHERE event_id = :event_id AND sink = :sink AND seq <= (
    SELECT seq FROM event_steps WHERE event_id = :event_id AND sink = :sink
    ORDER BY seq DESC LIMIT 1 OFFSET :keep
)
"""

SELECT_STEPS = "SELECT " + STEP_COLUMNS + " FROM event_steps WHERE event_id = :event_id"


async def write_steps(c: Conn, event_id: str, steps: Sequence[Step]) -> None:
    """Add ``steps`` to the event's, keeping the newest of each delivery."""
    if not steps:
        return
    kept = bounded(steps)
    for step in kept:
        await c.run(INSERT_STEP, step.params(event_id))
    for sink in dict.fromkeys(step.sink for step in kept):
        params = {"event_id": event_id, "sink": sink, "keep": MAX_STEPS_PER_DELIVERY}
        await c.run(TRIM_STEPS, params)


class SqlSteps(SqlMixin):
    """Reading an event's steps."""

    async def event_steps(self, event_id: str) -> list[Step]:
        async def run(c: Conn) -> list[Step]:
            return in_order(
                step_record(r) for r in await c.rows(SELECT_STEPS, {"event_id": event_id})
            )

        return await self._run_read(run)
