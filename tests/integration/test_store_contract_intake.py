"""The store contract, intake: adding events (new once per id, whatever the id; refused alike,
and alone in their group, when they cannot be stored), finding them again, and keeping them
across a close and a reopen.

Part of one contract for every inbox backend: memory, SQLite, and Postgres when it is
reachable. The backends, the fixtures and the helpers are in :mod:`tests.support.store_contract`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

from receiver.errors import PayloadError, StoreError, StoreUnavailable
from receiver.store import Outcome, Store
from tests.support.store_cases import ODD_IDS, T0, UNSTORABLE_IDS, new_event, states
from tests.support.store_contract import (
    StoreFactory,
    backend,
    on_shared_inboxes,
    open_backend,
    store,
)

__all__ = ["backend", "open_backend", "store"]  # fixtures, used by name


# -- adding events ------------------------------------------------------------------------------


async def test_add_new_then_duplicate(store: Store) -> None:
    assert await store.add_event(new_event("ev-1")) is True
    assert await store.add_event(new_event("ev-1", body=b'{"id": "other"}')) is False

    record = await store.get("ev-1")
    assert record is not None
    assert record.id == "ev-1"
    assert record.event == "job.completed"
    assert record.job_id == "job-ev-1"
    assert record.body == b'{"id": "ev-1", "object": "event"}'  # the first copy is kept
    assert dict(record.headers) == {
        "Service-Event-Id": "ev-1",
        "Content-Type": "application/json",
    }
    assert record.received_at == T0
    assert record.state == "pending"
    assert [d.sink for d in record.deliveries] == ["alpha", "beta"]
    for d in record.deliveries:
        assert (d.event_id, d.state, d.attempts, d.last_error) == ("ev-1", "pending", 0, None)
        assert d.next_attempt_at is not None and d.next_attempt_at <= T0


async def test_deliveries_sorted_by_sink_and_repeated_sinks_collapse(store: Store) -> None:
    await store.add_event(new_event("ev-1", sinks=("zeta", "alpha", "mid", "alpha")))
    record = await store.get("ev-1")
    assert record is not None
    assert [d.sink for d in record.deliveries] == ["alpha", "mid", "zeta"]


async def test_concurrent_adds_answer_true_exactly_once_per_id(store: Store) -> None:
    ids = [f"ev-{i}" for i in range(200)]
    calls = [*ids, *ids, *random.sample(ids, 50)]
    random.Random(7).shuffle(calls)

    results = await asyncio.gather(*(store.add_event(new_event(i)) for i in calls))

    new_per_id: dict[str, int] = {}
    for event_id, is_new in zip(calls, results, strict=True):
        new_per_id[event_id] = new_per_id.get(event_id, 0) + int(is_new)
    assert new_per_id == dict.fromkeys(ids, 1)
    counts, _ = await store.counts()
    assert counts["pending"] == 200


@pytest.mark.parametrize("event_id", ODD_IDS)
async def test_odd_ids_are_stored_once_and_found_again(store: Store, event_id: str) -> None:
    # Whatever intake lets through or not, the store's duplicate look and its unique index agree.
    assert await store.add_event(new_event(event_id)) is True
    assert await store.add_event(new_event(event_id)) is False
    record = await store.get(event_id)
    assert record is not None and (record.id, record.job_id) == (event_id, f"job-{event_id}")
    assert [d.event_id for d in record.deliveries] == [event_id, event_id]
    assert [r.id for r in await store.list()] == [event_id]


@pytest.mark.parametrize("field", ["id", "event", "job_id"])
@pytest.mark.parametrize("value", UNSTORABLE_IDS)
async def test_a_nul_or_lone_surrogate_is_refused_alike_every_time(
    store: Store, field: str, value: str
) -> None:
    # Never a StoreError (intake would answer 503 and the upstream retry for a day), never a
    # first success then a failure: PayloadError on every try, and nothing stored.
    event = dataclasses.replace(new_event("ev-1"), **{field: value})
    for _attempt in range(2):
        with pytest.raises(PayloadError):
            await store.add_event(event)
    assert await store.list() == []
    assert await store.add_event(new_event("ev-1")) is True


async def test_a_refused_event_fails_alone_in_its_group(store: Store) -> None:
    events = [new_event(f"ev-{i}") for i in range(5)]
    events[2] = new_event("ev-\x00")
    results = await asyncio.gather(*(store.add_event(e) for e in events), return_exceptions=True)
    assert [r is True for r in results] == [True, True, False, True, True]
    assert isinstance(results[2], PayloadError) and not isinstance(results[2], StoreError)
    assert sorted(r.id for r in await store.list()) == ["ev-0", "ev-1", "ev-3", "ev-4"]


async def test_get_unknown_is_none(store: Store) -> None:
    assert await store.get("nope") is None


async def test_ping_and_on_new_events(store: Store) -> None:
    await store.ping()
    store.on_new_events(lambda: None)


async def test_closed_store_raises_store_unavailable(open_backend: StoreFactory) -> None:
    store = await open_backend()
    await store.close()
    with pytest.raises(StoreUnavailable):
        await store.add_event(new_event("ev-1"))


# -- durability ---------------------------------------------------------------------------------


@on_shared_inboxes
async def test_data_survives_close_and_reopen(open_backend: StoreFactory) -> None:
    store = await open_backend()
    await store.add_event(new_event("ev-1"))
    await store.settle("ev-1", "alpha", Outcome(state="done"), now=T0 + 1)
    await store.close()

    reopened = await open_backend()
    record = await reopened.get("ev-1")
    assert record is not None
    assert states(record) == {"alpha": "done", "beta": "pending"}
    assert await reopened.add_event(new_event("ev-1")) is False
