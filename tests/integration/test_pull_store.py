"""The store's pull-mode half on every backend: watch list, leases, expiry, one outcome per job.

Every test passes ``now`` explicitly, so leases and expiry are checked without sleeping.
"""

from __future__ import annotations

import asyncio
import json

from receiver.store import NewEvent, Store
from tests.support import store_contract as contract

# The contract suite's backends: memory, SQLite, and Postgres when it is reachable.
backend = contract.backend
open_backend = contract.open_backend
store = contract.store
StoreFactory = contract.StoreFactory


async def two_stores(backend: str, open_backend: StoreFactory) -> tuple[Store, Store]:
    """Two instances on one inbox (one shared instance for memory, which cannot share)."""
    first = await open_backend()
    return first, first if backend == "memory" else await open_backend()


T0 = 1_700_000_000.0
JOB = "0b6f6a52-6d43-4a57-9d4f-1f0e6a2b9c11"
JOB2 = "7c0e1d2a-3b4c-4d5e-8f60-718293a4b5c6"


def outcome(event_id: str, source: str, *, job_id: str = JOB, event: str = "job.completed"):
    body = json.dumps({"id": event_id, "object": "event", "event": event, "job_id": job_id})
    return NewEvent(
        id=event_id,
        event=event,
        job_id=job_id,
        body=body.encode(),
        headers={},
        received_at=T0,
        sinks=("files",),
        source=source,
    )


async def events_of(store: Store, job_id: str = JOB) -> list[str]:
    return sorted(r.id for r in await store.list(limit=1000) if r.job_id == job_id)


# -- one outcome per job ------------------------------------------------------------------------


async def test_a_poll_after_a_webhook_of_the_same_outcome_is_a_duplicate(store: Store) -> None:
    assert await store.add_event(outcome("hook-1", "webhook")) is True
    assert await store.add_event(outcome("poll-1", "poll")) is False
    assert await events_of(store) == ["hook-1"]
    assert await store.known_outcomes([f"job.completed {JOB}", f"job.failed {JOB}"]) == {
        f"job.completed {JOB}"
    }


async def test_a_reconcile_event_is_judged_by_its_assets_not_by_the_outcome(store: Store) -> None:
    """Reconcile names only assets the asset ledger says no event took (a derived format that
    finished after the webhook's event), so the held outcome does not refuse it; a webhook
    after a reconcile that brought the outcome first is still a duplicate."""
    assert await store.add_event(outcome("hook-1", "webhook")) is True
    assert await store.add_event(outcome("rec-1", "reconcile")) is True
    assert await store.add_event(outcome("rec-1", "reconcile")) is False  # its own id again
    assert await events_of(store) == ["hook-1", "rec-1"]
    other = "7d3e4f5a-6b7c-4d8e-9f0a-1b2c3d4e5f60"
    assert await store.add_event(outcome("rec-2", "reconcile", job_id=other)) is True
    assert await store.add_event(outcome("hook-2", "webhook", job_id=other)) is False
    assert await events_of(store, other) == ["rec-2"]


async def test_a_webhook_after_a_poll_of_the_same_outcome_is_a_duplicate(store: Store) -> None:
    assert await store.add_event(outcome("poll-1", "poll")) is True
    assert await store.add_event(outcome("hook-1", "webhook")) is False
    assert await store.add_event(outcome("poll-1", "poll")) is False  # its own id again
    assert await events_of(store) == ["poll-1"]


async def test_webhooks_among_themselves_dedup_by_event_id_only(store: Store) -> None:
    assert await store.add_event(outcome("hook-1", "webhook")) is True
    assert await store.add_event(outcome("hook-2", "webhook")) is True
    assert await store.add_event(outcome("hook-1", "webhook")) is False
    assert await events_of(store) == ["hook-1", "hook-2"]


async def test_other_outcomes_and_jobs_are_separate(store: Store) -> None:
    assert await store.add_event(outcome("p-1", "poll")) is True
    assert await store.add_event(outcome("p-2", "poll", event="job.failed")) is True
    assert await store.add_event(outcome("p-3", "poll", job_id=JOB2)) is True
    assert await store.add_event(outcome("p-4", "poll", event="job.progress")) is True
    assert await store.add_event(outcome("p-5", "poll", event="job.progress")) is True


async def test_a_webhook_and_a_poll_racing_store_one_event(
    backend: str, open_backend: StoreFactory
) -> None:
    stores = await two_stores(backend, open_backend)
    for round_ in range(20):
        job_id = f"{round_:08d}-6d43-4a57-9d4f-1f0e6a2b9c11"
        results = await asyncio.gather(
            stores[0].add_event(outcome(f"hook-{round_}", "webhook", job_id=job_id)),
            stores[1].add_event(outcome(f"poll-{round_}", "poll", job_id=job_id)),
        )
        assert sorted(results) == [False, True], round_
        assert len(await events_of(stores[0], job_id)) == 1


async def test_two_webhooks_of_one_outcome_racing_are_both_stored(
    backend: str, open_backend: StoreFactory
) -> None:
    stores = await two_stores(backend, open_backend)
    for round_ in range(20):
        job_id = f"{round_:08d}-aaaa-4a57-9d4f-1f0e6a2b9c11"
        results = await asyncio.gather(
            stores[0].add_event(outcome(f"a-{round_}", "webhook", job_id=job_id)),
            stores[1].add_event(outcome(f"b-{round_}", "webhook", job_id=job_id)),
        )
        assert results == [True, True], round_


async def test_outcomes_of_many_jobs_arriving_together_are_each_recorded(store: Store) -> None:
    """One group of webhooks for many jobs records every job's outcome: a poll of any of them
    afterwards is a duplicate, a poll of another job is not."""
    jobs = [f"{n:08d}-bbbb-4a57-9d4f-1f0e6a2b9c11" for n in range(300)]
    results = await asyncio.gather(
        *(store.add_event(outcome(f"hook-{n}", "webhook", job_id=j)) for n, j in enumerate(jobs))
    )
    assert results == [True] * len(jobs)
    keys = [f"job.completed {j}" for j in jobs]
    assert await store.known_outcomes(keys) == set(keys)
    polls = await asyncio.gather(
        *(store.add_event(outcome(f"poll-{n}", "poll", job_id=j)) for n, j in enumerate(jobs))
    )
    assert polls == [False] * len(jobs)
    assert await store.add_event(outcome("poll-other", "poll", job_id=JOB2)) is True


# -- the watch list -----------------------------------------------------------------------------


async def test_watching_is_idempotent_and_an_ended_watch_starts_again(store: Store) -> None:
    (first,) = await store.add_watches([JOB], now=T0, expires_at=T0 + 100)
    assert (first.job_id, first.state, first.since, first.polls) == (JOB, "watching", T0, 0)
    (again,) = await store.add_watches([JOB], now=T0 + 5, expires_at=T0 + 105)
    assert again.since == T0  # already watching: unchanged

    assert await store.claim_watches(owner="a", limit=5, lease_seconds=30, now=T0 + 6)
    await store.settle_watch(JOB, owner="a", state="not_found", now=T0 + 7, error="404")
    (ended,) = await store.list_watches()
    assert (ended.state, ended.polls, ended.last_polled_at, ended.last_error) == (
        "not_found",
        1,
        T0 + 7,
        "404",
    )
    (rearmed,) = await store.add_watches([JOB], now=T0 + 8, expires_at=T0 + 108)
    assert (rearmed.state, rearmed.since, rearmed.polls) == ("watching", T0 + 8, 0)

    assert await store.claim_watches(owner="a", limit=5, lease_seconds=30, now=T0 + 9)
    await store.settle_watch(JOB, owner="a", state="done", now=T0 + 10)
    (done,) = await store.add_watches([JOB], now=T0 + 11, expires_at=T0 + 111)
    assert done.state == "done"  # a finished job is not polled again


async def test_a_claimed_watch_is_not_claimed_again_until_settled_or_its_lease_ends(
    backend: str, open_backend: StoreFactory
) -> None:
    one, two = await two_stores(backend, open_backend)
    await one.add_watches([JOB, JOB2], now=T0, expires_at=T0 + 1000)
    a = await one.claim_watches(owner="a", limit=1, lease_seconds=30, now=T0)
    b = await two.claim_watches(owner="b", limit=5, lease_seconds=30, now=T0)
    assert len(a) == 1 and len(b) == 1 and a[0].job_id != b[0].job_id
    assert await two.claim_watches(owner="b", limit=5, lease_seconds=30, now=T0 + 1) == []

    # Settled by someone else than the owner: ignored.
    await two.settle_watch(a[0].job_id, owner="b", state="done", now=T0 + 2)
    assert {w.state for w in await one.list_watches()} == {"watching"}

    # Still running: due again at the time given, claimable by anyone.
    await one.settle_watch(
        a[0].job_id, owner="a", state="watching", now=T0 + 3, next_poll_at=T0 + 10
    )
    assert await two.claim_watches(owner="b", limit=5, lease_seconds=30, now=T0 + 5) == []
    (again,) = await two.claim_watches(owner="b", limit=5, lease_seconds=30, now=T0 + 10)
    assert again.job_id == a[0].job_id

    # b's lease on the other job runs out: a takes it over.
    (taken,) = await one.claim_watches(owner="a", limit=5, lease_seconds=30, now=T0 + 31)
    assert taken.job_id == b[0].job_id


async def test_watches_past_their_expiry_end_expired(store: Store) -> None:
    await store.add_watches([JOB], now=T0, expires_at=T0 + 100)
    await store.add_watches([JOB2], now=T0 + 50, expires_at=T0 + 150)
    assert await store.expire_watches(now=T0 + 99) == 0
    claimed = await store.claim_watches(owner="a", limit=5, lease_seconds=30, now=T0 + 100)
    assert [w.job_id for w in claimed] == [JOB2]  # JOB's time is up: not polled again
    assert await store.expire_watches(now=T0 + 120) == 1  # JOB2 is leased: left alone
    assert {w.job_id: w.state for w in await store.list_watches()} == {
        JOB: "expired",
        JOB2: "watching",
    }
    assert await store.watch_counts() == {"expired": 1, "watching": 1}
    assert [w.job_id for w in await store.list_watches(state="expired")] == [JOB]
    assert [w.job_id for w in await store.list_watches()] == [JOB2, JOB]  # newest first


# -- the asset ledger ---------------------------------------------------------------------------


async def test_the_asset_ledger_is_written_with_the_snapshot_and_keeps_the_latest_time(
    store: Store,
) -> None:
    from receiver.store.asset_ledger import LedgerEntry
    from receiver.store.records import Snapshot

    assert await store.add_event(outcome("hook-1", "webhook")) is True
    assert await store.add_event(outcome("hook-2", "webhook", job_id=JOB2)) is True
    assert await store.ledger(["asset a1"]) == {}
    snapshot = Snapshot(job={"id": JOB, "status": "completed"}, assets=(), fetched_at=T0)
    entries = [LedgerEntry(f"job {JOB}"), LedgerEntry("asset a1"), LedgerEntry("item i image", 5.0)]
    await store.save_snapshot("hook-1", snapshot, ledger=entries, now=T0)
    later = [LedgerEntry("item i image", 9.0), LedgerEntry("asset a1")]
    await store.save_snapshot("hook-2", snapshot, ledger=later, now=T0 + 1)
    earlier = [LedgerEntry("item i image", 7.0)]
    await store.save_snapshot("hook-2", snapshot, ledger=earlier, now=T0 + 2)
    assert await store.ledger([f"job {JOB}", "asset a1", "item i image", "asset other"]) == {
        f"job {JOB}": None,
        "asset a1": None,
        "item i image": 9.0,
    }
