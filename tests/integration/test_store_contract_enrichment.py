"""The store contract, enrichment: events claimed for their job to be fetched, oldest first
when due; the lease on that claim; a failed fetch backing off, then giving up; and the snapshot
that makes an event's deliveries due (or settles the sinks it filters out), never replaced by
an older one.

Part of one contract for every inbox backend: memory, SQLite, and Postgres when it is
reachable. The backends, the fixtures and the helpers are in :mod:`tests.support.store_contract`.
Every test passes ``now`` explicitly, so leases and due times are checked without sleeping.
"""

from __future__ import annotations

import pytest

from receiver.errors import UnknownEvent
from receiver.store import Outcome, Store
from receiver.store.lanes_model import Leases
from tests.support.store_cases import T0, new_event, redeliver, states
from tests.support.store_contract import (
    LEASE,
    backend,
    claim,
    enrich_ids,
    enriched,
    open_backend,
    snapshot,
    store,
)

__all__ = ["backend", "open_backend", "store"]  # fixtures, used by name


# -- enrichment ---------------------------------------------------------------------------------


async def test_enrichment_waits_for_due_time_and_comes_oldest_first(store: Store) -> None:
    for i, offset in enumerate([5.0, 1.0, 4.0, 2.0, 3.0]):
        await store.add_event(new_event(f"ev-{i}", received_at=T0 + offset))
    assert await enrich_ids(store, now=T0) == []
    assert await enrich_ids(store, limit=2, now=T0 + 10) == ["ev-1", "ev-3"]
    [record] = await store.claim_enrichment(owner="w2", limit=1, lease_seconds=LEASE, now=T0 + 10)
    assert record.id == "ev-4"
    assert record.snapshot is None and record.enrich_attempts == 0
    assert [d.sink for d in record.deliveries] == ["alpha", "beta"]
    assert await enrich_ids(store, owner="w3", now=T0 + 10) == ["ev-2", "ev-0"]
    assert await enrich_ids(store, owner="w3", now=T0 + 10) == []
    assert await enrich_ids(store, limit=0, now=T0 + 999) == []


async def test_an_event_without_a_snapshot_has_nothing_to_deliver(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    assert await claim(store, now=T0 + 100) == []
    await enriched(store, "ev-1")
    assert await claim(store, now=T0 + 100) == ["ev-1"]
    # The snapshot is stored once: nothing to enrich any more.
    assert await enrich_ids(store, now=T0 + 100) == []
    record = await store.get("ev-1")
    assert record is not None and record.snapshot == snapshot(T0)
    assert record.enrich_at is None


async def test_event_without_sinks_is_done(store: Store) -> None:
    assert await store.add_event(new_event("ev-1", sinks=())) is True
    record = await store.get("ev-1")
    assert record is not None
    assert record.state == "done"
    assert record.deliveries == ()
    assert await enrich_ids(store, now=T0 + 999) == []
    assert (await store.counts())[0] == {"pending": 0, "done": 1, "dead": 0}


async def test_an_enrichment_lease_holds_until_it_runs_out_or_is_released(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    await store.add_event(new_event("ev-2"))
    assert await enrich_ids(store, now=T0) == ["ev-1", "ev-2"]
    assert await enrich_ids(store, owner="w2", now=T0 + 1) == []
    await store.release(Leases(events=("ev-1", "ev-2")), owner="intruder")
    await store.extend_leases(
        Leases(events=("ev-2",)), owner="w1", lease_seconds=LEASE, now=T0 + 30
    )
    assert await enrich_ids(store, owner="w2", now=T0 + 1) == []
    await store.release(Leases(events=("ev-1",)), owner="w1")
    assert await enrich_ids(store, owner="w2", now=T0 + 2) == ["ev-1"]
    # ev-2's lease was pushed to T0 + 90 (w2's lease of ev-1 runs until T0 + 62).
    assert await enrich_ids(store, owner="w3", now=T0 + LEASE + 1) == []
    assert await enrich_ids(store, owner="w3", now=T0 + 91) == ["ev-1", "ev-2"]
    await store.release(Leases(), owner="w1")


async def test_a_failed_enrichment_backs_off_then_gives_up(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    await store.settle("ev-1", "beta", Outcome(state="done"), now=T0)
    assert await enrich_ids(store, now=T0) == ["ev-1"]
    state = await store.fail_enrichment("ev-1", error="not ready", retry_at=T0 + 10, now=T0 + 1)
    assert state == "pending"
    assert await enrich_ids(store, now=T0 + 9) == []
    [record] = await store.claim_enrichment(owner="w", limit=5, lease_seconds=LEASE, now=T0 + 10)
    assert (record.enrich_attempts, record.enrich_error, record.enrich_at) == (
        1,
        "not ready",
        T0 + 10,
    )
    # Each pending delivery shows the failed attempt and when the next one is due.
    alpha, beta = record.deliveries
    assert (alpha.state, alpha.attempts, alpha.last_error, alpha.next_attempt_at) == (
        "pending",
        1,
        "not ready",
        T0 + 10,
    )
    assert (beta.state, beta.attempts) == ("done", 1)

    state = await store.fail_enrichment("ev-1", error="gave up: 404", retry_at=None, now=T0 + 11)
    assert state == "dead"
    record = await store.get("ev-1")
    assert record is not None
    assert states(record) == {"alpha": "dead", "beta": "done"}
    assert record.deliveries[0].last_error == "gave up: 404"
    assert record.deliveries[0].attempts == 2
    assert await enrich_ids(store, now=T0 + 999) == []

    # A redelivery fetches the job again first.
    assert await redeliver(store, now=T0 + 20) == 1
    assert await enrich_ids(store, now=T0 + 20) == ["ev-1"]
    record = await store.get("ev-1")
    assert record is not None and record.enrich_attempts == 0


async def test_the_snapshot_settles_filtered_out_sinks(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    await store.add_event(new_event("ev-2"))
    skip = Outcome(state="skipped", attempted=False)
    gone = Outcome(state="dead", error="sink beta is no longer configured")
    state = await store.save_snapshot(
        "ev-1", snapshot(), finished={"alpha": skip, "beta": skip}, now=T0
    )
    assert state == "done"
    state = await store.save_snapshot("ev-2", snapshot(), finished={"beta": gone}, now=T0)
    assert state == "pending"
    record = await store.get("ev-2")
    assert record is not None and states(record) == {"alpha": "pending", "beta": "dead"}
    assert await claim(store, "beta", now=T0 + 1) == []
    with pytest.raises(UnknownEvent):
        await store.save_snapshot("nope", snapshot(), now=T0)


async def test_a_refetched_snapshot_never_replaces_a_newer_one(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    await store.save_snapshot("ev-1", snapshot(T0 + 10, status="completed"), now=T0 + 10)
    await store.save_snapshot("ev-1", snapshot(T0 + 5, status="stale"), now=T0 + 11)
    record = await store.get("ev-1")
    assert record is not None and record.snapshot is not None
    assert record.snapshot.fetched_at == T0 + 10
    await store.save_snapshot("ev-1", snapshot(T0 + 20, status="newer"), now=T0 + 21)
    record = await store.get("ev-1")
    assert record is not None and record.snapshot is not None
    assert record.snapshot.job["status"] == "newer"
