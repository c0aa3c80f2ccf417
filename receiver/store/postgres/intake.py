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
#: Statements a group's events get at most: an event is judged again only when another
#: transaction claimed its job outcome during the statement (see ADD_EVENTS).
JUDGING_ROUNDS = 3


# A group of events in one statement, which is its own transaction (no BEGIN and COMMIT round
# trips): the group's job outcomes (receiver.store.pull) claimed in the ledger in key order,
# the events the outcome rule admits (arrays of columns, one element per event: its own claim
# of its outcome, a webhook beside an outcome a webhook brought, or any reconcile event, which
# names only assets no event took: receiver.store.pull), the deliveries of those
# that were new, and one notification for the whole group (sent by Postgres on commit, only
# when anything was new).
#
# A key another transaction is claiming makes the claim wait for it to commit; but the rest of
# the statement reads the ledger as of the statement's start, so it cannot see that outcome.
# Such an event is not judged here: it is answered in ``unjudged`` (neither stored nor
# refused), and the store runs the statement again for it, which sees the outcome. Answers the
# ids that were new and the ids not judged.
ADD_EVENTS = """
WITH rows AS (
    SELECT * FROM unnest(
        $1::text[], $2::text[], $3::text[], $4::bytea[], $5::json[],
        $6::double precision[], $7::text[], $8::double precision[], $16::text[], $14::text[],
        $15::text[]
    ) AS r (id, event, job_id, body, headers, received_at, state, enrich_at, trace, key, source)
), claimed AS (
    INSERT INTO job_outcomes (key, event_id, source, created_at)
    SELECT key, id, source, received_at FROM rows WHERE key IS NOT NULL ORDER BY key, id
    ON CONFLICT (key) DO NOTHING
    RETURNING key, event_id, source
), judged AS (
    SELECT r.*, coalesce(c.event_id, o.event_id) AS holder, coalesce(c.source, o.source) AS held_by
    FROM rows r
    LEFT JOIN claimed c ON c.key = r.key
    LEFT JOIN job_outcomes o ON o.key = r.key
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
       CASE WHEN count(*) > 0 THEN pg_notify($12, $13) END AS notified,
       (SELECT coalesce(array_agg(id), '{}') FROM judged WHERE key IS NOT NULL AND holder IS NULL)
           AS unjudged
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
        two groups (of two replicas) inserting the same ids lock them in the same order. Events
        the statement could not judge (another transaction was claiming their job outcome, see
        ADD_EVENTS) go again, in a statement of their own that sees that claim.
        """
        firsts: dict[str, NewEvent] = {}
        for event in events:
            firsts.setdefault(event.id, event)
        pending = sorted(firsts.values(), key=lambda e: e.id)
        added: set[str] = set()
        failed: StoreUnavailable | None = None
        for _round in range(JUDGING_ROUNDS):
            try:
                new, unjudged = await self._run(functools.partial(self._add_rows, pending))
            except StoreUnavailable as exc:
                failed = exc
                break
            added |= new
            pending = [event for event in pending if event.id in unjudged]
            if not pending:
                break
        else:
            failed = StoreUnavailable("job outcomes kept being claimed by other transactions")
        # Only the events still pending failed (none are unless a round failed): earlier rounds
        # are committed.
        unwritten = {event.id for event in pending}
        return [
            _copy_error(failed)
            if failed is not None and event.id in unwritten
            else event.id in added and firsts[event.id] is event
            for event in events
        ]

    async def _add_rows(self, rows: list[NewEvent], conn: Any) -> tuple[set[str], set[str]]:
        """ADD_EVENTS for ``rows`` (distinct ids, in id order): the ids new, the ids not judged."""
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
        answer = await conn.fetchrow(
            ADD_EVENTS, *values, *deliveries, CHANNEL, self._schema, keys, sources, traces
        )
        return set(answer["added"]), set(answer["unjudged"])


def _copy_error(exc: StoreUnavailable) -> StoreUnavailable:
    """One exception per caller: a shared one would collect every caller's traceback."""
    err = StoreUnavailable(exc.message)
    err.__cause__ = exc.__cause__
    return err
