"""What only the Postgres store has to get right, its migrations: replicas starting together
migrate a schema once, a schema it cannot use (new without ``auto_migrate``, newer than this
receiver) is refused, a role given only a ready-made schema migrates and works, and an inbox of
schema version 1 keeps its events.

The shared semantics are in the store contract (test_store_contract_*.py). Here several
store instances stand in for several replicas (each has its own pool of real connections).
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import asyncpg
import pytest

from receiver.errors import StoreUnavailable
from receiver.store.postgres import SCHEMA_VERSION, PostgresStore
from tests.support.postgres import POSTGRES_URL, store_settings
from tests.support.postgres_stores import T0, StoreFactory, fetchval, new_event, schema, stores

__all__ = ["schema", "stores"]  # fixtures, used by name


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
