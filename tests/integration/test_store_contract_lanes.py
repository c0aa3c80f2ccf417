"""The store contract, lanes: a sink's deliveries claimed when due, oldest first, each held by
its lease until it runs out, is released or settled, and never delayed by another lane's
backlog; a lane paced to its rate (across stores sharing the inbox too) and burst, paused by a
Retry-After, shut by its circuit until a probe succeeds; and what the lanes have waiting.

Part of one contract for every inbox backend: memory, SQLite, and Postgres when it is
reachable. The backends, the fixtures and the helpers are in :mod:`tests.support.store_contract`.
Every test passes ``now`` explicitly, so leases and due times are checked without sleeping.
"""

from __future__ import annotations

import asyncio

import pytest

from receiver.store import Outcome, Store, rules
from receiver.store.lanes_model import DeliveryKey, LaneResult, LaneStats, Leases
from tests.support.store_cases import T0, new_event
from tests.support.store_contract import (
    LEASE,
    StoreFactory,
    backend,
    claim,
    enriched,
    lane,
    on_shared_inboxes,
    open_backend,
    snapshot,
    store,
)

__all__ = ["backend", "open_backend", "store"]  # fixtures, used by name


# -- lanes: claiming ----------------------------------------------------------------------------


async def test_lane_claims_wait_for_the_due_time(store: Store) -> None:
    await store.add_event(new_event("ev-1", received_at=T0))
    await enriched(store, "ev-1")
    assert await claim(store, now=T0 - 1) == []
    got = await store.claim_deliveries(lane(), owner="w1", limit=10, lease_seconds=LEASE, now=T0)
    [leased] = got.deliveries
    assert leased.event.id == "ev-1" and leased.event.snapshot == snapshot()
    assert leased.delivery.sink == "alpha" and leased.delivery.state == "pending"
    assert leased.delivery.leased_until == T0 + LEASE


async def test_lane_claims_oldest_first_with_limit(store: Store) -> None:
    for i, offset in enumerate([5.0, 1.0, 4.0, 2.0, 3.0]):
        await store.add_event(new_event(f"ev-{i}", received_at=T0 + offset))
        await enriched(store, f"ev-{i}")
    now = T0 + 10
    assert await claim(store, limit=2, now=now) == ["ev-1", "ev-3"]
    assert await claim(store, owner="w2", now=now) == ["ev-4", "ev-2", "ev-0"]
    assert await claim(store, owner="w3", now=now) == []
    assert await claim(store, limit=0, now=now + 999) == []
    # Each lane has its own deliveries.
    assert len(await claim(store, "beta", now=now)) == 5


async def test_a_leased_delivery_is_not_claimed_again_until_its_lease_runs_out(
    store: Store,
) -> None:
    await store.add_event(new_event("ev-1"))
    await enriched(store, "ev-1")
    assert await claim(store, now=T0) == ["ev-1"]
    assert await claim(store, owner="w2", now=T0 + 1) == []
    assert await claim(store, owner="w1", now=T0 + 1) == []  # not twice to its holder either
    assert await claim(store, owner="w2", now=T0 + LEASE + 1) == ["ev-1"]
    # w1 lost the lease: its release must not free w2's claim.
    await store.release(Leases(deliveries=(DeliveryKey("ev-1", "alpha"),)), owner="w1")
    assert await claim(store, owner="w3", now=T0 + LEASE + 2) == []


async def test_delivery_leases_extend_and_release_only_for_their_owner(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    await store.add_event(new_event("ev-2", received_at=T0 + 1))
    await enriched(store, "ev-1", "ev-2")
    assert await claim(store, now=T0 + 1) == ["ev-1", "ev-2"]
    one, two = DeliveryKey("ev-1", "alpha"), DeliveryKey("ev-2", "alpha")
    unknown = DeliveryKey("unknown", "alpha")

    await store.release(Leases(deliveries=(one, two, unknown)), owner="intruder")
    await store.extend_leases(
        Leases(deliveries=(two,)), owner="intruder", lease_seconds=999, now=T0
    )
    assert await claim(store, owner="w2", now=T0 + 2) == []

    await store.extend_leases(
        Leases(deliveries=(two,)), owner="w1", lease_seconds=LEASE, now=T0 + 30
    )
    await store.release(Leases(deliveries=(one,)), owner="w1")
    assert await claim(store, owner="w2", now=T0 + 2) == ["ev-1"]
    # The first lease of ev-2 ran out at T0 + 61; the extended one runs until T0 + 90
    # (and w2's of ev-1 until T0 + 62).
    assert await claim(store, owner="w3", now=T0 + 62) == []
    assert await claim(store, owner="w3", now=T0 + 91) == ["ev-1", "ev-2"]
    await store.extend_leases(Leases(), owner="w2", lease_seconds=LEASE, now=T0 + 91)


async def test_settle_drops_the_lease_so_a_retry_comes_back_when_due(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    await enriched(store, "ev-1")
    assert await claim(store, now=T0) == ["ev-1"]
    retry = Outcome(state="pending", error="x", next_attempt_at=T0 + 5)
    await store.settle("ev-1", "alpha", retry, now=T0 + 1)
    got = await store.claim_deliveries(lane(), owner="w2", limit=5, lease_seconds=LEASE, now=T0 + 2)
    assert got.deliveries == () and got.retry_at == T0 + 5
    assert await claim(store, owner="w2", now=T0 + 5) == ["ev-1"]


async def test_one_lanes_backlog_never_delays_another_lane(store: Store) -> None:
    for i in range(60):
        await store.add_event(new_event(f"old-{i:02}", sinks=("slow",), received_at=T0 + i / 100))
        await enriched(store, f"old-{i:02}")
    await store.add_event(new_event("new", sinks=("fast", "slow"), received_at=T0 + 10))
    await enriched(store, "new")
    assert await claim(store, "fast", limit=1, now=T0 + 10) == ["new"]
    assert len(await claim(store, "slow", limit=100, now=T0 + 10)) == 61


# -- lanes: pacing, pauses, circuit -------------------------------------------------------------


async def test_a_paced_lane_hands_out_one_delivery_per_token(store: Store) -> None:
    for i in range(10):
        await store.add_event(new_event(f"ev-{i}", received_at=T0 + i / 1000))
        await enriched(store, f"ev-{i}")
    paced = lane(rate=1.0, burst=1.0)
    first = await store.claim_deliveries(paced, owner="w", limit=8, lease_seconds=LEASE, now=T0 + 1)
    assert [x.event.id for x in first.deliveries] == ["ev-0"]
    # The next token in a second (and a little: the bucket keeps a margin).
    assert first.retry_at == pytest.approx(T0 + 1 + 1 / rules.PACE)
    assert await claim(store, policy=paced, now=T0 + 2) == []
    assert await claim(store, policy=paced, now=T0 + 2.04) == ["ev-1"]
    # A long idle time refills only up to the burst.
    assert await claim(store, policy=paced, now=T0 + 50) == ["ev-2"]
    assert await claim(store, policy=paced, now=T0 + 50.5) == []
    # A claim that finds nothing spends nothing.
    other = lane("beta", rate=1.0, burst=1.0)
    assert await claim(store, "beta", policy=other, now=T0 - 10) == []
    assert await claim(store, "beta", policy=other, now=T0 + 1) == ["ev-0"]


@on_shared_inboxes
async def test_two_stores_on_one_inbox_keep_to_one_lanes_rate(open_backend: StoreFactory) -> None:
    a, b = await open_backend(), await open_backend()
    for i in range(40):
        await a.add_event(new_event(f"ev-{i:02}", received_at=T0))
        await enriched(a, f"ev-{i:02}")
    paced = lane(rate=2.0, burst=1.0)
    taken: list[tuple[float, str]] = []
    # Ten seconds; four workers on two stores claim at once, each time at the moment the last
    # claims said the next token is due (as lanes do).
    now = T0
    while now <= T0 + 10:
        claims = await asyncio.gather(
            *(
                s.claim_deliveries(paced, owner=f"w{n}", limit=8, lease_seconds=LEASE, now=now)
                for n, s in enumerate((a, b, a, b))
            )
        )
        taken += [(now, leased.event.id) for c in claims for leased in c.deliveries]
        retry_at = min(c.retry_at for c in claims if c.retry_at is not None)
        assert retry_at > now
        now = retry_at
    assert len({event_id for _, event_id in taken}) == len(taken)  # never one twice
    # The one token at the start, then (a hair under) two a second.
    assert 20 <= len(taken) <= 21
    times = [t for t, _ in taken]
    assert all(sum(1 for u in times if t <= u < t + 1.0) <= 2 for t in times)


async def test_a_burst_and_an_unpaced_lane(store: Store) -> None:
    for i in range(30):
        await store.add_event(new_event(f"ev-{i:02}", received_at=T0))
        await enriched(store, f"ev-{i:02}")
    assert len(await claim(store, policy=lane(rate=50.0, burst=5.0), limit=20, now=T0)) == 5
    assert len(await claim(store, "beta", policy=lane("beta"), limit=20, now=T0)) == 20


async def test_a_retry_after_pauses_the_whole_lane(store: Store) -> None:
    for i in range(3):
        await store.add_event(new_event(f"ev-{i}", received_at=T0))
        await enriched(store, f"ev-{i}")
    policy = lane()
    assert await claim(store, policy=policy, limit=1, now=T0) == ["ev-0"]
    retry = Outcome(state="pending", error="429", next_attempt_at=T0 + 40)
    result = LaneResult(policy, "neutral", started=T0, pause=40.0)
    await store.settle("ev-0", "alpha", retry, now=T0 + 1, lane=result)
    got = await store.claim_deliveries(policy, owner="w", limit=5, lease_seconds=LEASE, now=T0 + 2)
    assert got.deliveries == () and got.retry_at == T0 + 41
    assert await claim(store, "beta", now=T0 + 2) == ["ev-0", "ev-1", "ev-2"]  # others go on
    assert await claim(store, policy=policy, now=T0 + 41) == ["ev-1", "ev-2", "ev-0"]


async def test_a_circuit_opens_after_failures_and_a_probe_closes_it(store: Store) -> None:
    for i in range(8):
        await store.add_event(new_event(f"ev-{i}", received_at=T0))
        await enriched(store, f"ev-{i}")
    policy = lane(circuit_failures=3, circuit_pause=10.0, circuit_max=100.0)
    taken = await claim(store, policy=policy, limit=4, now=T0)
    assert len(taken) == 4

    def failed(started: float) -> LaneResult:
        return LaneResult(policy, "failure", started=started)

    retry = Outcome(state="pending", error="timeout", next_attempt_at=T0 + 1)
    for n, event_id in enumerate(taken[:3]):
        await store.settle(event_id, "alpha", retry, now=T0 + 5 + n, lane=failed(T0))
    # Open at T0 + 7 for 10 s; the fourth failure began before that: not counted again.
    await store.settle(taken[3], "alpha", retry, now=T0 + 8, lane=failed(T0))
    assert await claim(store, policy=policy, now=T0 + 16) == []
    # Half-open: one probe; the lane stays shut while it runs.
    [probe] = await claim(store, policy=policy, now=T0 + 17.5)
    assert await claim(store, policy=policy, now=T0 + 18) == []
    # The probe fails: paused twice as long.
    await store.settle(probe, "alpha", retry, now=T0 + 20, lane=failed(T0 + 17.5))
    assert await claim(store, policy=policy, now=T0 + 39) == []
    [probe] = await claim(store, policy=policy, now=T0 + 40.5)
    success = LaneResult(policy, "success", started=T0 + 40.5)
    await store.settle(probe, "alpha", Outcome(state="done"), now=T0 + 41, lane=success)
    assert len(await claim(store, policy=policy, now=T0 + 41)) == 7


async def test_lane_stats(store: Store) -> None:
    for i in range(4):
        await store.add_event(new_event(f"ev-{i}", received_at=T0 + i))
    await enriched(store, "ev-0", "ev-1", "ev-2")
    assert await claim(store, limit=1, now=T0 + 10) == ["ev-0"]
    later = Outcome(state="pending", error="x", next_attempt_at=T0 + 100)
    await store.settle("ev-2", "beta", later, now=T0 + 10)
    await store.settle("ev-1", "beta", Outcome(state="done"), now=T0 + 10)

    stats = await store.lane_stats(now=T0 + 10)
    # alpha: ev-0 in flight; ev-1, ev-2 due (ev-3 has no snapshot yet).
    assert stats["alpha"] == LaneStats(backlog=2, oldest_due=T0 + 1, in_flight=1)
    # beta: ev-0 due; ev-2 not due yet; ev-1 done.
    assert stats["beta"] == LaneStats(backlog=1, oldest_due=T0, in_flight=0)
    assert "gamma" not in stats


async def test_pending_sinks(store: Store) -> None:
    assert await store.pending_sinks() == set()
    await store.add_event(new_event("ev-1", sinks=("alpha", "beta", "gamma")))
    await store.add_event(new_event("ev-2", sinks=("beta",)))
    await store.settle("ev-1", "gamma", Outcome(state="done"), now=T0 + 1)
    await store.settle("ev-1", "beta", Outcome(state="dead", error="x"), now=T0 + 1)
    assert await store.pending_sinks() == {"alpha", "beta"}
    await store.settle("ev-2", "beta", Outcome(state="done"), now=T0 + 2)
    assert await store.pending_sinks() == {"alpha"}
