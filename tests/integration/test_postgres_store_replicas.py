"""What only the Postgres store has to get right: several replicas on one inbox, storing,
claiming, settling and pruning the same events at once, and taking over a dead replica's
claims once their lease runs out.

The shared semantics are in the store contract (test_store_contract_*.py). Here several
store instances stand in for several replicas (each has its own pool of real connections).
"""

from __future__ import annotations

import asyncio
import random

import asyncpg
import pytest

from receiver.errors import UnknownEvent
from receiver.store import Outcome
from receiver.store.lanes_model import LanePolicy
from receiver.store.postgres import PostgresStore
from tests.support.postgres import POSTGRES_URL
from tests.support.postgres_stores import (
    LEASE,
    SNAPSHOT,
    T0,
    StoreFactory,
    fetchval,
    new_event,
    schema,
    stores,
)

__all__ = ["schema", "stores"]  # fixtures, used by name


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
