"""Postgres stores for the tests of what only the Postgres store has to get right
(tests/integration/test_postgres_store_*.py): a fresh schema per test (the ``schema`` fixture),
store instances opened on it, each standing in for a replica (``stores``), events for them, and
``fetchval`` to read the schema beside the store.

A test module imports the fixtures ``schema`` and ``stores`` by name (and lists them in
``__all__``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest

from receiver.store import NewEvent
from receiver.store.postgres import PostgresStore
from receiver.store.records import Snapshot
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres, store_settings

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
