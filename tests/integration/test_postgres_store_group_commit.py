"""What only the Postgres store has to get right: group commit. Concurrent adds share one
statement, one commit and one NOTIFY, each caller told whether its event was new; the statement
reads the tables only through their keys as the inbox grows, and a job outcome another
transaction claims meanwhile is judged by its holder.

The shared semantics are in the store contract (test_store_contract_*.py). Here several
store instances stand in for several replicas (each has its own pool of real connections).
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import replace

import asyncpg
import pytest

from receiver.store.postgres import CHANNEL
from receiver.store.pull import outcome_key
from tests.support.helpers import wait_for
from tests.support.postgres import POSTGRES_URL
from tests.support.postgres_stores import T0, StoreFactory, fetchval, new_event, schema, stores

__all__ = ["schema", "stores"]  # fixtures, used by name


# -- group commit -------------------------------------------------------------------------------


class Notifications:
    """NOTIFYs on the receiver's channel for one schema, as another session LISTENing sees
    them. The channel is shared by every schema of the database (the payload names the
    schema), so other test runs' notifications are left out."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.payloads: list[str] = []
        self.conn: asyncpg.Connection | None = None

    async def __aenter__(self) -> Notifications:
        self.conn = await asyncpg.connect(POSTGRES_URL)
        await self.conn.add_listener(CHANNEL, self._heard)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.conn is not None
        await self.conn.close()

    def _heard(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload == self.schema:
            self.payloads.append(payload)

    async def settle(self) -> None:
        """Every notification committed so far has arrived (a round trip after them)."""
        assert self.conn is not None
        await self.conn.fetchval("SELECT 1")
        await asyncio.sleep(0.2)


async def test_one_group_one_statement_one_notify_and_each_caller_told_new_or_not(
    stores: StoreFactory, schema: str
) -> None:
    store = await stores()
    assert await store.add_event(new_event("old")) is True
    async with Notifications(schema) as heard:
        await heard.settle()
        groups = store._adds.groups
        # Gathered in one loop iteration: one group, with an id twice and an id already stored.
        ids = ["a", "b", "a", "old", "c", "b", "a"]
        results = await asyncio.gather(*(store.add_event(new_event(i)) for i in ids))
        assert store._adds.groups == groups + 1
        assert results == [True, True, False, False, True, False, False]
        await heard.settle()
        assert heard.payloads == [schema]

        # A group with nothing new commits no notification at all.
        assert await asyncio.gather(*(store.add_event(new_event(i)) for i in ids)) == [False] * 7
        await heard.settle()
        assert heard.payloads == [schema]
    assert await fetchval(schema, "SELECT count(*) FROM events") == 4
    assert await fetchval(schema, "SELECT count(*) FROM deliveries") == 8


async def test_many_concurrent_adds_share_commits_with_one_notify_each(
    stores: StoreFactory, schema: str
) -> None:
    store = await stores()
    async with Notifications(schema) as heard:
        await heard.settle()
        groups = store._adds.groups

        async def add_soon(n: int) -> bool:
            await asyncio.sleep(random.random() * 0.05)  # arriving over a while, as webhooks do
            return await store.add_event(new_event(f"ev-{n}"))

        assert all(await asyncio.gather(*(add_soon(n) for n in range(400))))
        written = store._adds.groups - groups
        await heard.settle()
    assert 1 <= written < 400
    assert len(heard.payloads) == written
    assert await fetchval(schema, "SELECT count(*) FROM events") == 400


async def test_a_growing_inbox_is_written_without_reading_any_table_whole(
    stores: StoreFactory, schema: str
) -> None:
    """Intake's statement reads the ledger, the events and the deliveries only through their
    keys, whatever plan Postgres made while the tables were small: a statement that joined the
    ledger was planned on the empty table as a scan of all of it, and kept that plan while the
    ledger grew (every group read every outcome recorded before it). Here the groups' statements
    run in one transaction of the test's own connection, whose table counters
    (pg_stat_xact_user_tables) count exactly what they read."""
    store = await stores()
    conn = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
    try:
        async with conn.transaction():
            for group in range(40):
                events = [new_event(f"ev-{group:04d}-{n:04d}") for n in range(25)]
                # Retries of webhooks already stored, and polls of outcomes already held.
                events += [new_event(f"ev-{group - 1:04d}-{n:04d}") for n in range(3) if group]
                events += [replace(e, id=f"poll-{e.id}", source="poll") for e in events[:2]]
                rows = sorted({e.id: e for e in events}.values(), key=lambda e: e.id)
                await store._add_rows(rows, conn)
            scans = await conn.fetchval(
                "SELECT json_object_agg(relname, seq_scan) FROM pg_stat_xact_user_tables "
                "WHERE schemaname = current_schema() "
                "AND relname IN ('events', 'deliveries', 'job_outcomes')"
            )
            assert await conn.fetchval("SELECT count(*) FROM events") == 40 * 25
    finally:
        await conn.close()
    assert json.loads(scans) == {"events": 0, "deliveries": 0, "job_outcomes": 0}


@pytest.mark.parametrize(("claimed_by", "stored"), [("webhook", True), ("poll", False)])
async def test_an_outcome_claimed_during_the_groups_statement_is_judged_by_its_holder(
    stores: StoreFactory, schema: str, claimed_by: str, stored: bool
) -> None:
    """Another transaction claims a webhook's job outcome while the group's statement waits for
    it: once that transaction commits, the statement's claim returns the holder it recorded
    (which the statement's own snapshot cannot see). Beside another webhook's outcome a webhook
    is stored; beside a poll's, it is a duplicate."""
    store = await stores()
    webhook = new_event("ev-webhook")
    key = outcome_key(webhook.event, webhook.job_id)
    other = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
    try:
        claim = other.transaction()
        await claim.start()
        await other.execute(
            "INSERT INTO job_outcomes (key, event_id, source, created_at) VALUES ($1, $2, $3, $4)",
            key,
            "ev-other",
            claimed_by,
            T0,
        )
        adding = asyncio.ensure_future(store.add_event(webhook))

        async def statement_waits_for_the_claim() -> bool:
            # Only statements this claim blocks: other tests' lock waits (the suite runs in
            # several processes on one database) are none of this test's business.
            waiting = await fetchval(
                schema,
                "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                other.get_server_pid(),
            )
            return waiting == 1

        await wait_for(statement_waits_for_the_claim, 10, what="the group waiting for the claim")
        await claim.commit()
        assert await adding is stored
    finally:
        await other.close()
    assert await fetchval(schema, "SELECT count(*) FROM events") == (1 if stored else 0)
    assert await fetchval(schema, "SELECT event_id FROM job_outcomes") == "ev-other"
