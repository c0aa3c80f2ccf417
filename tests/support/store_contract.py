"""The store contract's backends, fixtures and helpers: one contract for every inbox backend,
memory, SQLite, and Postgres when it is reachable.

The contract's tests are in tests/integration/test_store_contract_*.py; other store tests
(test_store_operations.py, test_store_browse.py, test_pull_store.py, test_store_batch_cancel.py)
run on the same backends. A test module imports the fixtures ``backend``, ``open_backend`` and
``store`` by name, all three, since each needs the one before it (and lists them in
``__all__``). ``on_shared_inboxes`` keeps a test to the backends whose inbox several store
instances can share.

The helpers take ``now`` as the store does: the tests pass it explicitly, so leases and due times
are checked without sleeping.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from receiver.config.settings import StoreSettings
from receiver.store import Store
from receiver.store.lanes_model import LanePolicy
from receiver.store.memory import MemoryStore
from receiver.store.records import Snapshot
from receiver.store.sqlite import SqliteStore
from tests.support.postgres import fresh_schema, require_postgres, store_settings
from tests.support.store_cases import T0

LEASE = 60.0

StoreFactory = Callable[[], Awaitable[Store]]


# -- backends -----------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "postgres":
        require_postgres()
    return name


# Cases about one inbox shared by several store instances (processes, replicas, restarts): not
# for the memory store, which is one instance's own and keeps nothing.
on_shared_inboxes = pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)


@pytest.fixture
async def open_backend(backend: str, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    """Opens a new store instance on this test's data each call; closes them all afterwards.

    Postgres tests each get a schema of their own in the test database, dropped afterwards.
    """
    opened: list[Store] = []
    async with contextlib.AsyncExitStack() as stack:
        schema = await stack.enter_async_context(fresh_schema()) if backend == "postgres" else ""

        async def factory() -> Store:
            store: Store
            if backend == "memory":
                store = MemoryStore(StoreSettings(url="memory://"))
            elif backend == "sqlite":
                store = SqliteStore(StoreSettings(url=f"sqlite:///{tmp_path / 'inbox.db'}"))
            else:
                from receiver.store.postgres import PostgresStore

                store = PostgresStore(store_settings(schema))
            await store.open()
            opened.append(store)
            return store

        try:
            yield factory
        finally:
            for store in opened:
                await store.close()


@pytest.fixture
async def store(open_backend: StoreFactory) -> Store:
    return await open_backend()


# -- enriching and claiming ---------------------------------------------------------------------


JOB = {"id": "job", "status": "completed", "type": "image"}


def snapshot(at: float = T0, **job: Any) -> Snapshot:
    return Snapshot(
        job={**JOB, **job}, assets=({"id": "ast_1", "status": "completed"},), fetched_at=at
    )


async def enriched(store: Store, *event_ids: str, now: float = T0) -> None:
    """Give each event its snapshot, as a worker does after fetching the job."""
    for event_id in event_ids:
        await store.save_snapshot(event_id, snapshot(now), now=now)


def lane(sink: str = "alpha", **kw: Any) -> LanePolicy:
    return LanePolicy(sink=sink, **kw)


async def claim(
    store: Store,
    sink: str = "alpha",
    *,
    owner: str = "w1",
    limit: int = 10,
    now: float = T0,
    policy: LanePolicy | None = None,
    lease: float = LEASE,
) -> list[str]:
    """Claim a lane; the event ids handed out, in order."""
    got = await store.claim_deliveries(
        policy or lane(sink), owner=owner, limit=limit, lease_seconds=lease, now=now
    )
    for leased in got.deliveries:
        assert leased.delivery.sink == sink
        assert leased.delivery.event_id == leased.event.id
    return [leased.event.id for leased in got.deliveries]


async def enrich_ids(
    store: Store, *, owner: str = "w1", limit: int = 10, now: float = T0
) -> list[str]:
    records = await store.claim_enrichment(owner=owner, limit=limit, lease_seconds=LEASE, now=now)
    return [r.id for r in records]
