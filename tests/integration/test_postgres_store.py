"""What only the Postgres store has to get right: several processes on one inbox.

The shared semantics are in test_store_contract.py. Here several store instances stand in for
several replicas (each has its own pool of real connections), and dropped connections are real
``pg_terminate_backend`` calls or a proxy whose port is closed.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from urllib.parse import urlsplit

import asyncpg
import pytest

from receiver.errors import StoreUnavailable, UnknownEvent
from receiver.store import NewEvent, Outcome
from receiver.store.lanes_model import LanePolicy
from receiver.store.postgres import CHANNEL, SCHEMA_VERSION, PostgresStore
from receiver.store.pull import outcome_key
from receiver.store.records import Snapshot
from tests.support.helpers import free_port, wait_for
from tests.support.postgres import (
    POSTGRES_URL,
    TcpProxy,
    fresh_schema,
    require_postgres,
    store_settings,
    terminate_backends,
    url_with,
)
from tests.support.store_cases import redeliver

T0 = 1_700_000_000.0
LEASE = 60.0
SNAPSHOT = Snapshot(job={"id": "job", "status": "completed"}, assets=(), fetched_at=T0)

StoreFactory = Callable[..., Awaitable[PostgresStore]]


def new_event(event_id: str, *, sinks: tuple[str, ...] = ("alpha", "beta")) -> NewEvent:
    return NewEvent(
        id=event_id,
        event="job.completed",
        job_id=f"job-{event_id}",
        body=b'{"id": "%s"}' % event_id.encode(),
        headers={"Service-Event-Id": event_id},
        received_at=T0,
        sinks=sinks,
    )


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    require_postgres()
    async with fresh_schema() as name:
        yield name


@pytest.fixture
async def stores(schema: str) -> AsyncIterator[StoreFactory]:
    """Opens a store (a "replica") on this test's schema per call; closes them all afterwards."""
    opened: list[PostgresStore] = []

    async def make(**overrides: object) -> PostgresStore:
        store = PostgresStore(store_settings(schema, **overrides))
        await store.open()
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()


async def fetchval(schema: str, query: str, *args: object) -> object:
    conn = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
    try:
        return await conn.fetchval(query, *args)
    finally:
        await conn.close()


# -- migrations ---------------------------------------------------------------------------------


async def test_replicas_starting_together_migrate_once(schema: str) -> None:
    replicas = [PostgresStore(store_settings(schema, pool_size=1)) for _ in range(6)]
    try:
        await asyncio.gather(*(store.open() for store in replicas))
        reports = await asyncio.gather(*(store.migrate() for store in replicas))
    finally:
        await asyncio.gather(*(store.close() for store in replicas))

    assert all(r.after == SCHEMA_VERSION and r.applied == () for r in reports)
    rows = await fetchval(schema, "SELECT count(*) FROM receiver_schema_migrations")
    assert rows == SCHEMA_VERSION
    assert await fetchval(schema, "SELECT count(*) FROM events") == 0


async def test_concurrent_migrations_on_a_fresh_schema_apply_each_version_once(
    schema: str,
) -> None:
    replicas = [PostgresStore(store_settings(schema)) for _ in range(8)]
    reports = await asyncio.gather(*(store.migrate() for store in replicas))

    applied = sorted(v for r in reports for v in r.applied)
    assert applied == list(range(1, SCHEMA_VERSION + 1))
    assert {r.after for r in reports} == {SCHEMA_VERSION}
    versions = await fetchval(
        schema, "SELECT array_agg(version ORDER BY version) FROM receiver_schema_migrations"
    )
    assert versions == list(range(1, SCHEMA_VERSION + 1))


async def test_without_auto_migrate_a_fresh_schema_is_refused(schema: str) -> None:
    store = PostgresStore(store_settings(schema, auto_migrate=False))
    with pytest.raises(StoreUnavailable, match="receiver migrate"):
        await store.open()

    report = await store.migrate()
    assert (report.before, report.after) == (0, SCHEMA_VERSION)
    assert report.applied == tuple(range(1, SCHEMA_VERSION + 1))
    await store.open()  # up to date now: auto_migrate is not needed
    try:
        assert await store.add_event(new_event("ev-1")) is True
    finally:
        await store.close()


async def test_a_newer_schema_is_refused(stores: StoreFactory, schema: str) -> None:
    await stores()
    await fetchval(
        schema,
        "INSERT INTO receiver_schema_migrations (version, description) VALUES (99, 'future')",
    )
    with pytest.raises(StoreUnavailable, match="newer than this receiver"):
        await PostgresStore(store_settings(schema)).open()


# -- several replicas on one inbox --------------------------------------------------------------


async def test_the_same_events_stored_by_two_replicas_exist_once(
    stores: StoreFactory, schema: str
) -> None:
    a, b = await stores(), await stores()
    ids = [f"ev-{i}" for i in range(300)]
    calls = [(store, event_id) for event_id in ids for store in (a, b)]
    random.Random(3).shuffle(calls)

    results = await asyncio.gather(*(store.add_event(new_event(i)) for store, i in calls))

    new_per_id: dict[str, int] = {}
    for (_store, event_id), is_new in zip(calls, results, strict=True):
        new_per_id[event_id] = new_per_id.get(event_id, 0) + int(is_new)
    assert new_per_id == dict.fromkeys(ids, 1)
    assert await fetchval(schema, "SELECT count(*) FROM events") == 300
    assert await fetchval(schema, "SELECT count(*) FROM deliveries") == 600


async def test_concurrent_claims_never_hand_out_an_event_twice(stores: StoreFactory) -> None:
    replicas = [await stores() for _ in range(4)]
    for i in range(200):
        await replicas[0].add_event(new_event(f"ev-{i:03}"))
    enriching: list[str] = []
    delivering: list[str] = []

    async def drain(store: PostgresStore, owner: str) -> None:
        while records := await store.claim_enrichment(
            owner=owner, limit=7, lease_seconds=LEASE, now=T0
        ):
            enriching.extend(r.id for r in records)
            for record in records:
                await store.save_snapshot(record.id, SNAPSHOT, now=T0)
        while claim := (
            await store.claim_deliveries(
                LanePolicy("alpha"), owner=owner, limit=7, lease_seconds=LEASE, now=T0
            )
        ).deliveries:
            delivering.extend(leased.event.id for leased in claim)

    await asyncio.gather(
        *(drain(store, f"w{n}-{k}") for n, store in enumerate(replicas) for k in range(3))
    )
    assert sorted(enriching) == [f"ev-{i:03}" for i in range(200)]
    assert sorted(delivering) == [f"ev-{i:03}" for i in range(200)]


async def test_a_dead_replicas_claims_return_after_the_lease(stores: StoreFactory) -> None:
    a, b = await stores(), await stores()
    for i in range(5):
        await a.add_event(new_event(f"ev-{i}"))
    assert len(await a.claim_enrichment(owner="a", limit=10, lease_seconds=LEASE, now=T0)) == 5
    await a.close()  # gone without releasing anything

    assert await b.claim_enrichment(owner="b", limit=10, lease_seconds=LEASE, now=T0 + 59) == []
    taken = await b.claim_enrichment(owner="b", limit=10, lease_seconds=LEASE, now=T0 + 61)
    assert sorted(r.id for r in taken) == [f"ev-{i}" for i in range(5)]
    for record in taken:
        await b.save_snapshot(record.id, SNAPSHOT, now=T0 + 61)

    c = await stores()
    alpha = LanePolicy("alpha")
    claim = await c.claim_deliveries(alpha, owner="c", limit=10, lease_seconds=LEASE, now=T0 + 61)
    assert len(claim.deliveries) == 5
    await c.close()
    again = await b.claim_deliveries(alpha, owner="b", limit=10, lease_seconds=LEASE, now=T0 + 120)
    assert again.deliveries == ()
    again = await b.claim_deliveries(alpha, owner="b", limit=10, lease_seconds=LEASE, now=T0 + 122)
    assert len(again.deliveries) == 5


async def test_deliveries_of_one_event_settled_on_two_replicas_agree(
    stores: StoreFactory,
) -> None:
    a, b = await stores(), await stores()
    ids = [f"ev-{i}" for i in range(60)]
    for event_id in ids:
        await a.add_event(new_event(event_id))

    await asyncio.gather(
        *(
            settle
            for event_id in ids
            for settle in (
                a.settle(event_id, "alpha", Outcome("done"), now=T0 + 1),
                b.settle(event_id, "beta", Outcome("done"), now=T0 + 1),
            )
        )
    )
    assert (await a.counts())[0] == {"pending": 0, "done": 60, "dead": 0}


async def test_settle_of_an_unknown_delivery_leaves_the_pool_usable(stores: StoreFactory) -> None:
    store = await stores(pool_size=1)
    await store.add_event(new_event("ev-1"))
    for _ in range(3):
        with pytest.raises(UnknownEvent):
            await store.settle("ev-1", "nope", Outcome("done"), now=T0)
    await store.settle("ev-1", "alpha", Outcome("done"), now=T0)


async def test_prune_skips_rows_in_use_instead_of_waiting(
    stores: StoreFactory, schema: str
) -> None:
    store = await stores()
    for i in range(30):
        await store.add_event(new_event(f"ev-{i:02}", sinks=()))
    holder = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
    try:
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM events WHERE id = 'ev-07' FOR UPDATE")
            # Another replica holds one row: the other 29 go at once, in batches of 10.
            assert await store.prune(older_than=T0 + 1, batch=10) == 29
    finally:
        await holder.close()
    assert await store.prune(older_than=T0 + 1, batch=10) == 1
    assert (await store.counts())[0] == {"pending": 0, "done": 0, "dead": 0}


# -- waking idle workers ------------------------------------------------------------------------


class Wakes:
    """Counts callback calls; ``await wakes.reach(n)`` waits for the n-th."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1

    async def reach(self, n: int) -> None:
        async def reached() -> bool:
            return self.count >= n

        await wait_for(reached, what=f"{n} wake-ups")


async def test_new_events_wake_other_replicas_of_the_same_schema_only(
    stores: StoreFactory,
) -> None:
    writer, idle = await stores(), await stores()
    require_postgres()
    async with fresh_schema() as other_schema:
        other = PostgresStore(store_settings(other_schema))
        await other.open()
        try:
            wakes = Wakes()
            idle.on_new_events(wakes)
            await wakes.reach(1)  # once listening: whatever arrived before is looked at

            await other.add_event(new_event("elsewhere"))  # another inbox: no wake-up
            await writer.add_event(new_event("ev-1"))
            await wakes.reach(2)
            # Notifications arrive in commit order: had the other schema's woken us, the count
            # would already be past 2.
            assert wakes.count == 2

            await writer.add_event(new_event("ev-1"))  # a duplicate adds nothing to wake for
            await writer.add_event(new_event("ev-2"))
            await wakes.reach(3)
            assert wakes.count == 3

            await writer.settle("ev-2", "alpha", Outcome("dead", error="x"), now=T0 + 1)
            await redeliver(writer, now=T0 + 2)
            await wakes.reach(4)
            await redeliver(writer, now=T0 + 3, status="any", event_id="ev-1")
            await wakes.reach(5)
        finally:
            await other.close()


async def test_the_listener_comes_back_after_its_connection_is_killed(schema: str) -> None:
    name = "receiver-listen-" + schema[-8:]
    idle = PostgresStore(store_settings(schema, url=url_with(application_name=name)))
    writer = PostgresStore(store_settings(schema))
    await idle.open()
    await writer.open()
    try:
        wakes = Wakes()
        idle.on_new_events(wakes)
        await wakes.reach(1)
        assert await terminate_backends(name) >= 1

        await wakes.reach(2)  # reconnected (and looks once for what it may have missed)
        await writer.add_event(new_event("ev-1"))
        await wakes.reach(3)
    finally:
        await idle.close()
        await writer.close()


# -- dropped connections and an unreachable database --------------------------------------------


async def test_a_pooled_connection_still_busy_is_closed_and_the_call_runs_on_another(
    schema: str,
) -> None:
    """A connection back in the pool while an operation on it has not ended (as when the server
    ended it and the driver has read why but not yet the end of the stream) makes the driver
    refuse to start anything on it. The store closes that one and runs the call on another,
    rather than failing the call, or the next ones, with it."""
    store = PostgresStore(store_settings(schema))
    await store.open()
    try:
        assert store._pool is not None
        conn = await store._pool.acquire()
        busy = asyncio.create_task(conn.fetchval("SELECT pg_sleep(30)"))
        await asyncio.sleep(0.1)
        await store._pool.release(conn)  # the pool hands it out next
        assert await store.add_event(new_event("ev-1")) is True
        await store.settle("ev-1", "alpha", Outcome("done"), now=T0 + 1)
        record = await store.get("ev-1")
        assert record is not None
        assert {d.sink: d.state for d in record.deliveries}["alpha"] == "done"
        # The busy connection was closed under its statement, not left to finish it.
        with pytest.raises(asyncpg.ConnectionDoesNotExistError):
            await asyncio.wait_for(busy, 10)
    finally:
        await store.close()


async def test_a_statement_cut_off_by_a_dropped_connection_is_store_unavailable(
    schema: str,
) -> None:
    name = "receiver-drop-" + schema[-8:]
    store = PostgresStore(store_settings(schema, url=url_with(application_name=name)))
    await store.open()
    holder = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
    try:
        await store.add_event(new_event("ev-1"))
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM events WHERE id = 'ev-1' FOR UPDATE")
            # The settle waits for the row lock when its connection is killed under it.
            settle = asyncio.create_task(store.settle("ev-1", "alpha", Outcome("done"), now=T0 + 1))

            async def waiting() -> bool:
                rows = await holder.fetchval(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE application_name = $1 AND wait_event_type = 'Lock'",
                    name,
                )
                return bool(rows)

            await wait_for(waiting, what="the settle to wait for the lock")
            assert await terminate_backends(name) >= 1
            with pytest.raises(StoreUnavailable, match="Postgres inbox"):
                await settle

        # The pool replaces the dead connection: the next calls just work.
        await store.settle("ev-1", "alpha", Outcome("done"), now=T0 + 2)
        assert await store.add_event(new_event("ev-2")) is True
        record = await store.get("ev-1")
        assert record is not None
        assert {d.sink: d.state for d in record.deliveries} == {
            "alpha": "done",
            "beta": "pending",
        }
    finally:
        await holder.close()
        await store.close()


async def test_an_unreachable_database_is_store_unavailable_until_it_returns(
    schema: str,
) -> None:
    proxy = TcpProxy()
    await proxy.start()
    store = PostgresStore(store_settings(schema, url=proxy.url(), timeout_seconds=2.0))
    await store.open()
    try:
        assert await store.add_event(new_event("before")) is True

        await proxy.stop()  # the database restarts: connections cut, the port closed
        for call in (
            store.add_event(new_event("during")),
            store.ping(),
            store.counts(),
            store.claim_enrichment(owner="w", limit=5, lease_seconds=LEASE, now=T0),
            store.claim_deliveries(
                LanePolicy("alpha"), owner="w", limit=5, lease_seconds=LEASE, now=T0
            ),
        ):
            with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{proxy.port}"):
                await call

        await proxy.start()

        async def healed() -> bool:
            try:
                return await store.add_event(new_event("after")) is True
            except StoreUnavailable:
                return False

        await wait_for(healed, what="the store to reconnect")
        assert await store.get("during") is None
        assert (await store.counts())[0]["pending"] == 2
    finally:
        await store.close()
        await proxy.stop()


async def test_opening_an_unreachable_database_names_it_without_the_password() -> None:
    port = free_port()  # nothing listens here
    url = f"postgresql://postgres:s3cret-pw@127.0.0.1:{port}/test"
    store = PostgresStore(store_settings("receiver_unused", url=url))
    with pytest.raises(StoreUnavailable) as caught:
        await store.open()
    message = caught.value.message
    assert f"cannot reach the Postgres inbox postgresql://127.0.0.1:{port}/test" in message
    assert "s3cret" not in message
    with pytest.raises(StoreUnavailable, match="not open"):
        await store.add_event(new_event("ev-1"))


async def test_a_role_given_a_ready_made_schema_can_migrate_and_work(schema: str) -> None:
    """The least privilege a DBA might grant: its own schema, no CREATE on the database."""
    role = "receiver_limited_" + schema[-8:]
    admin = await asyncpg.connect(POSTGRES_URL)
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN")
        await admin.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {role}")
        can_create = await admin.fetchval(
            "SELECT has_database_privilege($1, current_database(), 'CREATE')", role
        )
        assert can_create is False
        parts = urlsplit(POSTGRES_URL)
        url = parts._replace(netloc=f"{role}@{parts.netloc.rsplit('@', 1)[-1]}").geturl()
        store = PostgresStore(store_settings(schema, url=url))
        try:
            report = await store.migrate()
            assert report.applied == tuple(range(1, SCHEMA_VERSION + 1))
            await store.open()
            assert await store.add_event(new_event("ev-1")) is True
        finally:
            await store.close()
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()


async def test_a_hung_database_is_store_unavailable_within_the_timeout(schema: str) -> None:
    proxy = TcpProxy()
    await proxy.start()
    store = PostgresStore(store_settings(schema, url=proxy.url(), timeout_seconds=1.0))
    await store.open()
    try:
        assert await store.add_event(new_event("before")) is True
        proxy.hold()  # connections stay open, nothing comes back
        with pytest.raises(StoreUnavailable, match="did not answer within 1 s"):
            await store.add_event(new_event("during"))
        with pytest.raises(StoreUnavailable, match="did not answer within 1 s"):
            await store.ping()
        proxy.resume()

        async def healed() -> bool:
            try:
                await store.add_event(new_event("after"))
            except StoreUnavailable:
                return False
            return True

        await wait_for(healed, what="the store to answer again")
        record = await store.get("after")
        assert record is not None
    finally:
        await store.close()
        await proxy.stop()


@pytest.mark.parametrize(
    "url",
    ["postgresql://127.0.0.1:port/test", "postgresql://127.0.0.1:5432/test?sslmode=sometimes"],
)
async def test_a_malformed_url_is_named_as_such(url: str) -> None:
    with pytest.raises(StoreUnavailable, match="is not a usable Postgres url"):
        await PostgresStore(store_settings("receiver_unused", url=url)).open()


async def test_a_version_1_inbox_keeps_its_events_and_enriches_the_pending_ones(
    schema: str,
) -> None:
    from receiver.store.postgres import MIGRATIONS

    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.execute(f'SET search_path = "{schema}"')
        async with conn.transaction():
            for statement in MIGRATIONS[0].statements:
                await conn.execute(statement)
            await conn.execute(
                "CREATE TABLE receiver_schema_migrations (version integer PRIMARY KEY, "
                "description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            await conn.execute("INSERT INTO receiver_schema_migrations VALUES (1, 'v1')")
            await conn.execute(
                "INSERT INTO events (id, event, job_id, body, headers, received_at, state, "
                "next_attempt_at, lease_owner, lease_expires_at) VALUES "
                "('ev-1', 'job.completed', 'job-1', '\\x7b7d', '{}', $1, 'pending', $2, "
                "'old', $3)",
                T0,
                T0 + 5,
                T0 + 60,
            )
            await conn.execute(
                "INSERT INTO deliveries (event_id, sink, state, attempts, next_attempt_at, "
                "last_error, updated_at) VALUES ('ev-1', 'beta', 'pending', 2, $1, 'boom', $1)",
                T0 + 5,
            )
    finally:
        await conn.close()

    store = PostgresStore(store_settings(schema))
    await store.open()
    try:
        assert await fetchval(schema, "SELECT max(version) FROM receiver_schema_migrations") == (
            SCHEMA_VERSION
        )
        records = await store.claim_enrichment(owner="w", limit=5, lease_seconds=60, now=T0 + 1)
        assert [r.id for r in records] == ["ev-1"]
        [beta] = records[0].deliveries
        assert (beta.state, beta.attempts, beta.last_error) == ("pending", 2, "boom")
    finally:
        await store.close()


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


async def test_a_released_connection_costs_no_reset_round_trip(stores: StoreFactory) -> None:
    store = await stores(pool_size=1)
    await store.add_event(new_event("ev-1"))
    conn = await store._pool.acquire()
    try:
        await conn.execute("SET application_name = 'probe'")
    finally:
        await store._pool.release(conn)
    # The session setting survived the release: no RESET ALL (nor any other statement) ran.
    conn = await store._pool.acquire()
    try:
        assert await conn.fetchval("SHOW application_name") == "probe"
    finally:
        await store._pool.release(conn)
