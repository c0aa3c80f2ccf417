"""The Postgres inbox's intake: each group of new events (see :mod:`receiver.store.batching`)
written by one statement, its own transaction, that applies the job-outcome rule of
:mod:`receiver.store.pull` on the way."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from receiver.errors import StoreUnavailable
from receiver.store import rules
from receiver.store.postgres.conn import CHANNEL
from receiver.store.pull import outcome_key
from receiver.store.records import NewEvent

T = TypeVar("T")

#: Events written per group commit at most, and groups written at once: while one group's commit
#: is on its way the next one gathers, and a second one may be in flight. Intake therefore needs
#: at most GROUP_WRITERS pooled connections however many webhooks arrive at once.
MAX_GROUP = 500
GROUP_WRITERS = 2

# A group of events in one statement, which is its own transaction (no BEGIN and COMMIT round
# trips): the group's job outcomes (receiver.store.pull) claimed in the ledger in key order,
# the events the outcome rule admits (arrays of columns, one element per event: its own claim
# of its outcome, a webhook beside an outcome a webhook brought, or any reconcile event, which
# names only assets no event took: receiver.store.pull), the deliveries of those
# that were new, and one notification for the whole group (sent by Postgres on commit, only
# when anything was new). Answers the ids that were new.
#
# The ledger is read only through its key, by the claim itself: a key already held is
# "updated" to what it holds (DO UPDATE changes nothing), which returns its holder, so no other
# lookup of the ledger is needed (a join to it, planned while the table was small, scanned the
# whole ledger for every group). A key another transaction is claiming at the same moment makes
# the claim wait for it to commit and then returns that transaction's holder, although the
# statement's snapshot cannot see it. One claim a key (DISTINCT ON): the group's first event of
# a job outcome, in id order, is its claimant.
ADD_EVENTS = """
WITH rows AS (
    SELECT * FROM unnest(
        $1::text[], $2::text[], $3::text[], $4::bytea[], $5::json[],
        $6::double precision[], $7::text[], $8::double precision[], $16::text[], $14::text[],
        $15::text[]
    ) AS r (id, event, job_id, body, headers, received_at, state, enrich_at, trace, key, source)
), claimed AS (
    INSERT INTO job_outcomes AS o (key, event_id, source, created_at)
    SELECT DISTINCT ON (key) key, id, source, received_at FROM rows WHERE key IS NOT NULL
    ORDER BY key, id
    ON CONFLICT (key) DO UPDATE SET key = o.key
    RETURNING key, event_id, source
), judged AS (
    SELECT r.*, c.event_id AS holder, c.source AS held_by
    FROM rows r
    LEFT JOIN claimed c ON c.key = r.key
), ins AS (
    INSERT INTO events (
        id, event, job_id, body, headers, received_at, state, enrich_at, trace, stored_at
    )
    SELECT id, event, job_id, body, headers, received_at, state, enrich_at, trace,
        extract(epoch FROM clock_timestamp())::double precision
    FROM judged
    WHERE key IS NULL OR holder = id OR (held_by = 'webhook' AND source = 'webhook')
        OR source = 'reconcile'
    ORDER BY id
    ON CONFLICT (id) DO NOTHING
    RETURNING id
), dels AS (
    INSERT INTO deliveries (event_id, sink, state, attempts, next_attempt_at, updated_at)
    SELECT d.event_id, d.sink, 'pending', 0, d.at, d.at
    FROM unnest($9::text[], $10::text[], $11::double precision[]) AS d (event_id, sink, at)
    JOIN ins ON ins.id = d.event_id
)
SELECT coalesce(array_agg(id), '{}') AS added,
       CASE WHEN count(*) > 0 THEN pg_notify($12, $13) END AS notified
FROM ins
"""


class PostgresIntake:
    """Group commit of :meth:`~receiver.store.postgres.store.PostgresStore.add_event`."""

    if TYPE_CHECKING:
        _schema: str

        async def _run(
            self,
            fn: Callable[[Any], Awaitable[T]],
            *,
            transaction: bool = False,
            snapshot: bool = False,
        ) -> T: ...

    async def _write_adds(self, events: list[NewEvent]) -> list[bool | BaseException]:
        """One group: one statement, its own transaction; each event told whether its id was new.

        Within a group only the first event of an id can be new; the rows go in id order, so
        two groups (of two replicas) inserting the same ids lock them in the same order.
        """
        firsts: dict[str, NewEvent] = {}
        for event in events:
            firsts.setdefault(event.id, event)
        rows = sorted(firsts.values(), key=lambda e: e.id)
        try:
            added = await self._run(functools.partial(self._add_rows, rows))
        except StoreUnavailable as exc:
            return [_copy_error(exc) for _ in events]
        return [event.id in added and firsts[event.id] is event for event in events]

    async def _add_rows(self, rows: list[NewEvent], conn: Any) -> set[str]:
        """ADD_EVENTS for ``rows`` (distinct ids, in id order): the ids that were new."""
        columns: tuple[list[Any], ...] = ([], [], [], [], [], [], [], [], [])
        deliveries: tuple[list[Any], ...] = ([], [], [])
        for event in rows:
            row, sinks = rules.new_event_row(event)
            for column, value in zip(columns, row, strict=True):
                column.append(value)
            for sink in sinks:
                deliveries[0].append(event.id)
                deliveries[1].append(sink)
                deliveries[2].append(event.received_at)
        keys = [outcome_key(event.event, event.job_id) for event in rows]
        sources = [event.source for event in rows]
        *values, traces = columns
        added: list[str] = await conn.fetchval(
            ADD_EVENTS, *values, *deliveries, CHANNEL, self._schema, keys, sources, traces
        )
        return set(added)


def _copy_error(exc: StoreUnavailable) -> StoreUnavailable:
    """One exception per caller: a shared one would collect every caller's traceback."""
    err = StoreUnavailable(exc.message)
    err.__cause__ = exc.__cause__
    return err
