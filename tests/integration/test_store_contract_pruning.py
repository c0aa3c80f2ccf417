"""The store contract, pruning, counting and listing: old finished events pruned (in steps
and batches, with the ledgers' rows they leave behind), the space the inbox takes where the
backend can measure it, and the events counted and listed by state, newest first.

Part of one contract for every inbox backend: memory, SQLite, and Postgres when it is
reachable. The backends, the fixtures and the helpers are in :mod:`tests.support.store_contract`.
"""

from __future__ import annotations

import asyncpg

from receiver.store import Outcome, Store
from receiver.store.asset_ledger import FORGOTTEN_BEFORE, LedgerEntry
from receiver.store.pull import outcome_key
from receiver.store.records import DeliveryState
from tests.support.postgres import POSTGRES_URL, shared_buffers_bytes
from tests.support.store_cases import T0, new_event
from tests.support.store_contract import (
    backend,
    on_shared_inboxes,
    open_backend,
    snapshot,
    store,
)

__all__ = ["backend", "open_backend", "store"]  # fixtures, used by name


# -- pruning, counting, listing -----------------------------------------------------------------


async def _finish(store: Store, event_id: str, state: DeliveryState = "done") -> None:
    for sink in ("alpha", "beta"):
        await store.settle(event_id, sink, Outcome(state=state), now=T0 + 1)


async def test_prune_deletes_only_old_done_events(store: Store) -> None:
    await store.add_event(new_event("old-done", received_at=T0))
    await store.add_event(new_event("old-dead", received_at=T0))
    await store.add_event(new_event("old-pending", received_at=T0))
    await store.add_event(new_event("old-nosinks", received_at=T0, sinks=()))
    await store.add_event(new_event("new-done", received_at=T0 + 100))
    await _finish(store, "old-done")
    await _finish(store, "old-dead", "dead")
    await _finish(store, "new-done")

    assert await store.prune(older_than=T0 + 50) == 2

    assert await store.get("old-done") is None
    assert await store.get("old-nosinks") is None
    for kept in ("old-dead", "old-pending", "new-done"):
        assert await store.get(kept) is not None
    # Its deliveries went with it: the id can be stored afresh.
    assert await store.add_event(new_event("old-done", received_at=T0 + 200)) is True
    record = await store.get("old-done")
    assert record is not None
    assert [(d.state, d.attempts) for d in record.deliveries] == [("pending", 0)] * 2


async def test_a_prune_step_deletes_at_most_its_limit_oldest_rules_alike(store: Store) -> None:
    for i in range(7):
        await store.add_event(new_event(f"ev-{i}", received_at=T0 + i, sinks=()))
    await store.add_event(new_event("pending", received_at=T0))
    await store.add_event(new_event("keep", received_at=T0 + 1000, sinks=()))

    assert (await store.prune_step(older_than=T0 + 500, limit=3)).deleted == 3
    assert (await store.prune_step(older_than=T0 + 500, limit=3)).deleted == 3
    assert (await store.prune_step(older_than=T0 + 500, limit=3)).deleted == 1
    assert (await store.prune_step(older_than=T0 + 500, limit=3)).deleted == 0
    assert (await store.counts())[0] == {"pending": 1, "done": 1, "dead": 0}


@on_shared_inboxes
async def test_ledger_rows_are_forgotten_once_old_and_their_event_is_gone(store: Store) -> None:
    """Both ledgers lose the rows recorded before the cut whose event was pruned; the rows of
    an event still in the inbox (pending here) and the recent ones stay."""
    for event_id, at in (("gone", T0), ("kept", T0), ("recent", T0 + 1000)):
        sinks = ("alpha",) if event_id == "kept" else ()
        await store.add_event(new_event(event_id, received_at=at, sinks=sinks))
        entries = [LedgerEntry(f"asset a-{event_id}"), LedgerEntry(f"job job-{event_id}")]
        await store.save_snapshot(event_id, snapshot(at), ledger=entries, now=at)
    assert await store.prune(older_than=T0 + 500) == 1  # "gone"
    outcomes = [outcome_key("job.completed", f"job-{e}") for e in ("gone", "kept", "recent")]
    outcome_keys = [key for key in outcomes if key is not None]
    keys = [f"asset a-{e}" for e in ("gone", "kept", "recent")]
    assert len(await store.known_outcomes(outcome_keys)) == 3

    forgotten = 0
    while step := await store.prune_ledgers_step(older_than=T0 + 500, limit=1):
        forgotten += step
    assert forgotten == 3  # the outcome and the two asset-ledger rows of "gone"
    assert set(await store.ledger(keys)) == {"asset a-kept", "asset a-recent"}
    assert await store.known_outcomes(outcome_keys) == set(outcome_keys[1:])
    assert await store.prune_ledgers_step(older_than=T0 + 500, limit=10) == 0
    # The ledger says up to when it forgot (reconcile skips assets created before), raised only
    # by a step that forgot something, and is itself never forgotten.
    assert await store.ledger([FORGOTTEN_BEFORE]) == {FORGOTTEN_BEFORE: T0 + 500}
    assert await store.prune_ledgers_step(older_than=T0 + 9000, limit=10) == 0
    assert await store.ledger([FORGOTTEN_BEFORE]) == {FORGOTTEN_BEFORE: T0 + 500}


async def test_space_is_measured_where_the_backend_can(store: Store, backend: str) -> None:
    await store.add_event(new_event("one", received_at=T0, sinks=()))
    space = await store.space()
    if backend == "memory":
        assert space is None
        assert await store.reclaim_space(max_pages=10) == 0
        return
    assert space is not None
    assert space.file_bytes > 0
    # A SQLite inbox this release creates can give pages back; Postgres vacuums itself only
    # where the server's autovacuum is off.
    assert space.reclaimable is (backend == "sqlite" or await autovacuum_off())
    assert (space.free_bytes is not None) is (backend == "sqlite")
    # Postgres says how much of it is indexes, and how much of them its buffer cache can hold.
    if backend == "sqlite":
        assert space.index_bytes is None and space.cache_bytes is None
    else:
        assert space.index_bytes is not None and 0 < space.index_bytes < space.file_bytes
        assert space.cache_bytes == await shared_buffers_bytes()


async def autovacuum_off() -> bool:
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        return bool(await conn.fetchval("SELECT current_setting('autovacuum') = 'off'"))
    finally:
        await conn.close()


async def test_prune_in_batches_deletes_everything_due(store: Store) -> None:
    for i in range(25):
        await store.add_event(new_event(f"ev-{i:02}", received_at=T0 + i, sinks=()))
    await store.add_event(new_event("keep", received_at=T0 + 1000, sinks=()))

    assert await store.prune(older_than=T0 + 500, batch=10) == 25
    assert await store.prune(older_than=T0 + 500, batch=10) == 0
    assert (await store.counts())[0] == {"pending": 0, "done": 1, "dead": 0}


async def test_counts_and_oldest_pending(store: Store) -> None:
    assert await store.counts() == ({"pending": 0, "done": 0, "dead": 0}, None)

    await store.add_event(new_event("done-oldest", received_at=T0 - 100))
    await store.add_event(new_event("pending-old", received_at=T0 + 5))
    await store.add_event(new_event("pending-new", received_at=T0 + 9))
    await store.add_event(new_event("dead", received_at=T0 - 50))
    await _finish(store, "done-oldest")
    await _finish(store, "dead", "dead")

    counts, oldest = await store.counts()
    assert counts == {"pending": 2, "done": 1, "dead": 1}
    assert oldest == T0 + 5


async def test_list_filters_orders_and_pages(store: Store) -> None:
    for i in range(6):
        await store.add_event(new_event(f"ev-{i}", received_at=T0 + i))
    await _finish(store, "ev-1")
    await _finish(store, "ev-4")
    await _finish(store, "ev-2", "dead")

    everything = await store.list()
    assert [e.id for e in everything] == ["ev-5", "ev-4", "ev-3", "ev-2", "ev-1", "ev-0"]
    assert [d.sink for d in everything[0].deliveries] == ["alpha", "beta"]

    assert [e.id for e in await store.list(state="done")] == ["ev-4", "ev-1"]
    assert [e.id for e in await store.list(state="dead")] == ["ev-2"]
    assert [e.id for e in await store.list(state="pending")] == ["ev-5", "ev-3", "ev-0"]
    assert [e.id for e in await store.list(limit=2, offset=1)] == ["ev-4", "ev-3"]
    assert [e.id for e in await store.list(state="pending", limit=1, offset=1)] == ["ev-3"]
    assert await store.list(offset=10) == []
    assert await store.list(state="no-such-state") == []

    done = await store.list(state="done")
    assert done[0].state == "done"
    assert done[0].payload() == {"id": "ev-4", "object": "event"}
