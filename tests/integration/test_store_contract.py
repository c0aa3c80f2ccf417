"""One contract for every inbox backend: memory, SQLite, and Postgres when it is reachable.

Every test passes ``now`` explicitly, so leases and due times are checked without sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from receiver.config import StoreSettings
from receiver.errors import StoreUnavailable, UnknownEvent
from receiver.store import NewEvent, Outcome, Store
from receiver.store.base import DeliveryState
from receiver.store.memory import MemoryStore
from receiver.store.sqlite import SqliteStore
from tests.support.postgres import fresh_schema, require_postgres, store_settings

T0 = 1_700_000_000.0
LEASE = 60.0

StoreFactory = Callable[[], Awaitable[Store]]


def new_event(
    event_id: str,
    *,
    sinks: tuple[str, ...] = ("alpha", "beta"),
    received_at: float = T0,
    event: str = "job.completed",
    body: bytes | None = None,
) -> NewEvent:
    payload = body if body is not None else b'{"id": "%s", "object": "event"}' % event_id.encode()
    return NewEvent(
        id=event_id,
        event=event,
        job_id=f"job-{event_id}",
        body=payload,
        headers={"Service-Event-Id": event_id, "Content-Type": "application/json"},
        received_at=received_at,
        sinks=sinks,
    )


def states(record: Any) -> dict[str, str]:
    return {d.sink: d.state for d in record.deliveries}


# -- backends -----------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "postgres":
        if importlib.util.find_spec("receiver.store.postgres") is None:
            pytest.skip("postgres store not implemented")
        require_postgres()
    return name


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


async def test_event_without_sinks_is_done(store: Store) -> None:
    assert await store.add_event(new_event("ev-1", sinks=())) is True
    record = await store.get("ev-1")
    assert record is not None
    assert record.state == "done"
    assert record.deliveries == ()
    assert await store.claim(owner="w1", limit=10, lease_seconds=LEASE, now=T0 + 999) == []
    assert (await store.counts())[0] == {"pending": 0, "done": 1, "dead": 0}


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


# -- claiming -----------------------------------------------------------------------------------


async def test_claim_waits_for_due_time(store: Store) -> None:
    await store.add_event(new_event("ev-1", received_at=T0))
    assert await store.claim(owner="w1", limit=10, lease_seconds=LEASE, now=T0 - 1) == []

    [claim] = await store.claim(owner="w1", limit=10, lease_seconds=LEASE, now=T0)
    assert claim.owner == "w1"
    assert claim.event.id == "ev-1"
    assert claim.event.state == "pending"
    assert [d.sink for d in claim.event.deliveries] == ["alpha", "beta"]
    assert [d.sink for d in claim.due] == ["alpha", "beta"]


async def test_claim_oldest_first_with_limit(store: Store) -> None:
    for i, offset in enumerate([5.0, 1.0, 4.0, 2.0, 3.0]):
        await store.add_event(new_event(f"ev-{i}", received_at=T0 + offset))
    now = T0 + 10

    first = await store.claim(owner="w1", limit=2, lease_seconds=LEASE, now=now)
    assert [c.event.id for c in first] == ["ev-1", "ev-3"]
    second = await store.claim(owner="w2", limit=10, lease_seconds=LEASE, now=now)
    assert [c.event.id for c in second] == ["ev-4", "ev-2", "ev-0"]
    assert await store.claim(owner="w3", limit=10, lease_seconds=LEASE, now=now) == []
    assert await store.claim(owner="w1", limit=0, lease_seconds=LEASE, now=now + 999) == []


async def test_leased_event_is_not_claimed_again_until_lease_expires(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    assert len(await store.claim(owner="w1", limit=10, lease_seconds=LEASE, now=T0)) == 1

    assert await store.claim(owner="w2", limit=10, lease_seconds=LEASE, now=T0 + 1) == []
    # The holder itself does not get its own live claim twice either.
    assert await store.claim(owner="w1", limit=10, lease_seconds=LEASE, now=T0 + 1) == []

    [claim] = await store.claim(owner="w2", limit=10, lease_seconds=LEASE, now=T0 + LEASE + 1)
    assert claim.owner == "w2"
    # w1 lost the lease: its release must not free w2's claim.
    await store.release(["ev-1"], owner="w1")
    assert await store.claim(owner="w3", limit=10, lease_seconds=LEASE, now=T0 + LEASE + 2) == []


async def test_claim_returns_only_due_deliveries(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    retry = Outcome(state="pending", error="boom", next_attempt_at=T0 + 100)
    await store.settle("ev-1", "alpha", retry, now=T0 + 1)

    [claim] = await store.claim(owner="w1", limit=10, lease_seconds=LEASE, now=T0 + 10)
    assert [d.sink for d in claim.due] == ["beta"]
    assert [d.sink for d in claim.event.deliveries] == ["alpha", "beta"]


async def test_release_only_for_the_owner(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    await store.add_event(new_event("ev-2", received_at=T0 + 1))
    await store.claim(owner="w1", limit=10, lease_seconds=LEASE, now=T0 + 1)

    await store.release(["ev-1", "ev-2", "unknown"], owner="intruder")
    assert await store.claim(owner="w2", limit=10, lease_seconds=LEASE, now=T0 + 2) == []

    await store.release(["ev-1"], owner="w1")
    claims = await store.claim(owner="w2", limit=10, lease_seconds=LEASE, now=T0 + 2)
    assert [c.event.id for c in claims] == ["ev-1"]
    await store.release([], owner="w1")


async def test_extend_lease_only_for_the_owner(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    await store.claim(owner="w1", limit=10, lease_seconds=LEASE, now=T0)

    await store.extend_lease(["ev-1"], owner="intruder", lease_seconds=1000, now=T0 + 30)
    await store.extend_lease(["ev-1"], owner="w1", lease_seconds=LEASE, now=T0 + 30)
    # The original lease ran out at T0 + 60; the extended one runs until T0 + 90.
    assert await store.claim(owner="w2", limit=10, lease_seconds=LEASE, now=T0 + 61) == []
    claims = await store.claim(owner="w2", limit=10, lease_seconds=LEASE, now=T0 + 91)
    assert [c.event.id for c in claims] == ["ev-1"]
    await store.extend_lease([], owner="w2", lease_seconds=LEASE, now=T0 + 91)


# -- settling -----------------------------------------------------------------------------------


async def test_settle_done_everywhere_makes_event_done(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    await store.settle("ev-1", "alpha", Outcome(state="done"), now=T0 + 1)
    record = await store.get("ev-1")
    assert record is not None and record.state == "pending"

    await store.settle("ev-1", "beta", Outcome(state="done"), now=T0 + 2)
    record = await store.get("ev-1")
    assert record is not None
    assert record.state == "done"
    alpha, beta = record.deliveries
    assert (alpha.state, alpha.attempts, alpha.next_attempt_at, alpha.updated_at) == (
        "done",
        1,
        None,
        T0 + 1,
    )
    assert (beta.state, beta.attempts, beta.updated_at) == ("done", 1, T0 + 2)
    assert await store.claim(owner="w1", limit=10, lease_seconds=LEASE, now=T0 + 999) == []


async def test_settle_dead_makes_event_dead_once_nothing_is_pending(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    await store.settle("ev-1", "alpha", Outcome(state="dead", error="gone"), now=T0 + 1)
    record = await store.get("ev-1")
    assert record is not None and record.state == "pending"  # beta still pending

    await store.settle("ev-1", "beta", Outcome(state="done"), now=T0 + 2)
    record = await store.get("ev-1")
    assert record is not None
    assert record.state == "dead"
    assert record.deliveries[0].last_error == "gone"
    assert record.deliveries[0].next_attempt_at is None


async def test_skipped_counts_as_finished_and_not_as_an_attempt(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    await store.settle("ev-1", "alpha", Outcome(state="skipped", attempted=False), now=T0 + 1)
    await store.settle("ev-1", "beta", Outcome(state="done"), now=T0 + 1)
    record = await store.get("ev-1")
    assert record is not None
    assert record.state == "done"
    assert states(record) == {"alpha": "skipped", "beta": "done"}
    assert [d.attempts for d in record.deliveries] == [0, 1]


async def test_retries_count_attempts_and_push_the_next_attempt(store: Store) -> None:
    await store.add_event(new_event("ev-1", sinks=("alpha",)))
    for attempt in range(1, 4):
        due = T0 + attempt * 10
        outcome = Outcome(state="pending", error=f"try {attempt}", next_attempt_at=due)
        await store.settle("ev-1", "alpha", outcome, now=due - 5)
        record = await store.get("ev-1")
        assert record is not None
        [d] = record.deliveries
        assert (d.state, d.attempts, d.next_attempt_at, d.last_error) == (
            "pending",
            attempt,
            due,
            f"try {attempt}",
        )
        # Not due yet, then due.
        assert await store.claim(owner="w", limit=5, lease_seconds=1, now=due - 1) == []
        [claim] = await store.claim(owner="w", limit=5, lease_seconds=1, now=due)
        await store.release([claim.event.id], owner="w")

    await store.settle("ev-1", "alpha", Outcome(state="done"), now=T0 + 100)
    record = await store.get("ev-1")
    assert record is not None
    [d] = record.deliveries
    assert (d.state, d.attempts, d.last_error, d.next_attempt_at) == ("done", 4, None, None)


async def test_settle_does_not_touch_the_lease(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    await store.claim(owner="w1", limit=10, lease_seconds=LEASE, now=T0)
    retry = Outcome(state="pending", error="x", next_attempt_at=T0 + 1)
    await store.settle("ev-1", "alpha", retry, now=T0 + 1)
    assert await store.claim(owner="w2", limit=10, lease_seconds=LEASE, now=T0 + 2) == []


async def test_settle_unknown_delivery_raises_unknown_event(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    with pytest.raises(UnknownEvent):
        await store.settle("nope", "alpha", Outcome(state="done"), now=T0)
    with pytest.raises(UnknownEvent):
        await store.settle("ev-1", "no-such-sink", Outcome(state="done"), now=T0)
    await store.ping()  # the store still works afterwards


# -- redelivery ---------------------------------------------------------------------------------


async def test_redeliver_resets_every_delivery_but_skipped(store: Store) -> None:
    await store.add_event(new_event("ev-1", sinks=("alpha", "beta", "gamma")))
    await store.settle("ev-1", "alpha", Outcome(state="dead", error="gone"), now=T0 + 1)
    await store.settle("ev-1", "beta", Outcome(state="done"), now=T0 + 1)
    await store.settle("ev-1", "gamma", Outcome(state="skipped", attempted=False), now=T0 + 1)

    assert await store.redeliver("ev-1", now=T0 + 50) == 2

    record = await store.get("ev-1")
    assert record is not None
    assert record.state == "pending"
    assert states(record) == {"alpha": "pending", "beta": "pending", "gamma": "skipped"}
    for d in record.deliveries[:2]:
        assert (d.attempts, d.next_attempt_at, d.last_error, d.updated_at) == (
            0,
            T0 + 50,
            None,
            T0 + 50,
        )
    [claim] = await store.claim(owner="w1", limit=10, lease_seconds=LEASE, now=T0 + 50)
    assert [d.sink for d in claim.due] == ["alpha", "beta"]


async def test_redeliver_unknown_event(store: Store) -> None:
    with pytest.raises(UnknownEvent):
        await store.redeliver("nope", now=T0)


async def test_redeliver_dead_only_touches_dead_deliveries(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    await store.add_event(new_event("ev-2"))
    await store.add_event(new_event("ev-3"))
    await store.settle("ev-1", "alpha", Outcome(state="dead", error="x"), now=T0 + 1)
    await store.settle("ev-1", "beta", Outcome(state="done"), now=T0 + 1)
    await store.settle("ev-2", "alpha", Outcome(state="dead", error="y"), now=T0 + 1)
    await store.settle("ev-2", "beta", Outcome(state="dead", error="z"), now=T0 + 1)
    await store.settle("ev-3", "alpha", Outcome(state="done"), now=T0 + 1)
    await store.settle("ev-3", "beta", Outcome(state="done"), now=T0 + 1)
    assert (await store.counts())[0] == {"pending": 0, "done": 1, "dead": 2}

    assert await store.redeliver_dead(now=T0 + 20) == 3

    ev1, ev2, ev3 = [await store.get(i) for i in ("ev-1", "ev-2", "ev-3")]
    assert ev1 is not None and ev2 is not None and ev3 is not None
    assert (ev1.state, states(ev1)) == ("pending", {"alpha": "pending", "beta": "done"})
    assert (ev2.state, states(ev2)) == ("pending", {"alpha": "pending", "beta": "pending"})
    assert (ev3.state, states(ev3)) == ("done", {"alpha": "done", "beta": "done"})
    assert ev1.deliveries[0].attempts == 0 and ev1.deliveries[0].last_error is None
    assert ev1.deliveries[1].attempts == 1
    assert await store.redeliver_dead(now=T0 + 21) == 0


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


# -- durability ---------------------------------------------------------------------------------


async def test_data_survives_close_and_reopen(backend: str, open_backend: StoreFactory) -> None:
    if backend == "memory":
        pytest.skip("the memory store keeps nothing across instances")
    store = await open_backend()
    await store.add_event(new_event("ev-1"))
    await store.settle("ev-1", "alpha", Outcome(state="done"), now=T0 + 1)
    await store.close()

    reopened = await open_backend()
    record = await reopened.get("ev-1")
    assert record is not None
    assert states(record) == {"alpha": "done", "beta": "pending"}
    assert await reopened.add_event(new_event("ev-1")) is False
