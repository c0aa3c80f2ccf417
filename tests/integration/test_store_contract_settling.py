"""The store contract, settling and redelivery: a delivery settled done, dead, skipped or
retried (its attempts counted, its next attempt pushed), the event's state following its
deliveries; and a redelivery resetting the deliveries it is asked for.

Part of one contract for every inbox backend: memory, SQLite, and Postgres when it is
reachable. The backends, the fixtures and the helpers are in :mod:`tests.support.store_contract`.
Every test passes ``now`` explicitly, so leases and due times are checked without sleeping.
"""

from __future__ import annotations

import pytest

from receiver.delivery.redelivery import redeliver_event
from receiver.errors import UnknownEvent
from receiver.store import Outcome, Store
from tests.support.store_cases import T0, new_event, redeliver, states
from tests.support.store_contract import backend, claim, enriched, open_backend, store

__all__ = ["backend", "open_backend", "store"]  # fixtures, used by name


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
    assert await claim(store, now=T0 + 999) == []
    assert await claim(store, "beta", now=T0 + 999) == []


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
    await enriched(store, "ev-1")
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
        assert await claim(store, owner="w", now=due - 1) == []
        assert await claim(store, owner="w", lease=1, now=due) == ["ev-1"]

    await store.settle("ev-1", "alpha", Outcome(state="done"), now=T0 + 100)
    record = await store.get("ev-1")
    assert record is not None
    [d] = record.deliveries
    assert (d.state, d.attempts, d.last_error, d.next_attempt_at) == ("done", 4, None, None)


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

    assert await redeliver(store, now=T0 + 50, status="any", event_id="ev-1") == 2

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
    await enriched(store, "ev-1")
    assert await claim(store, "alpha", now=T0 + 50) == ["ev-1"]
    assert await claim(store, "beta", now=T0 + 50) == ["ev-1"]
    assert await claim(store, "gamma", now=T0 + 50) == []


async def test_redeliver_unknown_event(store: Store) -> None:
    with pytest.raises(UnknownEvent):
        await redeliver_event(store, "nope", sink=None, created_by="tests", now=T0)


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

    assert await redeliver(store, now=T0 + 20) == 3

    ev1, ev2, ev3 = [await store.get(i) for i in ("ev-1", "ev-2", "ev-3")]
    assert ev1 is not None and ev2 is not None and ev3 is not None
    assert (ev1.state, states(ev1)) == ("pending", {"alpha": "pending", "beta": "done"})
    assert (ev2.state, states(ev2)) == ("pending", {"alpha": "pending", "beta": "pending"})
    assert (ev3.state, states(ev3)) == ("done", {"alpha": "done", "beta": "done"})
    assert ev1.deliveries[0].attempts == 0 and ev1.deliveries[0].last_error is None
    assert ev1.deliveries[1].attempts == 1
    assert await redeliver(store, now=T0 + 21) == 0
