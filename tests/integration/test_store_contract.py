"""One contract for every inbox backend: memory, SQLite, and Postgres when it is reachable.

Every test passes ``now`` explicitly, so leases and due times are checked without sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from receiver.config.settings import StoreSettings
from receiver.delivery.redelivery import redeliver_event
from receiver.errors import PayloadError, StoreError, StoreUnavailable, UnknownEvent
from receiver.store import Outcome, Store, rules
from receiver.store.asset_ledger import FORGOTTEN_BEFORE, LedgerEntry
from receiver.store.lanes_model import DeliveryKey, LanePolicy, LaneResult, LaneStats, Leases
from receiver.store.memory import MemoryStore
from receiver.store.pull import outcome_key
from receiver.store.records import DeliveryState, Snapshot
from receiver.store.sqlite import SqliteStore
from receiver.store.steps import MAX_STEPS_PER_DELIVERY, Step
from tests.support.postgres import (
    POSTGRES_URL,
    fresh_schema,
    require_postgres,
    shared_buffers_bytes,
    store_settings,
)
from tests.support.store_cases import ODD_IDS, T0, UNSTORABLE_IDS, new_event, redeliver, states

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


# -- enrichment ---------------------------------------------------------------------------------

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


# -- the event's trace context and timeline (receiver.store.steps) ------------------------------

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _step(sink: str, n: int, *, kind: str = "attempt", outcome: str = "retry") -> Step:
    return Step(
        kind="attempt" if kind == "attempt" else "upstream",
        sink=sink,
        name=sink or "GET /jobs/{id}",
        attempt=n,
        started_at=T0 + n,
        ended_at=T0 + n + 0.25,
        outcome=outcome,
        error=None if outcome == "delivered" else f"HTTP 500 (attempt {n})",
        status=200 if outcome == "delivered" else 500,
    )


async def test_trace_context_is_kept_with_the_event(store: Store) -> None:
    await store.add_event(dataclasses.replace(new_event("traced"), trace=TRACEPARENT))
    await store.add_event(new_event("untraced"))
    traced, untraced = await store.get("traced"), await store.get("untraced")
    assert traced is not None and untraced is not None
    assert (traced.trace, untraced.trace) == (TRACEPARENT, None)
    assert traced.stored_at is not None
    assert traced.as_json()["traceparent"] == TRACEPARENT


async def test_steps_are_kept_with_the_result_they_belong_to(store: Store) -> None:
    await store.add_event(new_event("ev"))
    failed = _step("", 1, kind="upstream", outcome="503")
    await store.fail_enrichment("ev", error="503", retry_at=T0 + 5, now=T0 + 2, steps=[failed])
    fetched = _step("", 6, kind="upstream", outcome="200")
    await store.save_snapshot("ev", snapshot(T0 + 6), now=T0 + 7, steps=[fetched])
    retried = _step("alpha", 8)
    await store.settle("ev", "alpha", Outcome("pending", error="x"), now=T0 + 9, steps=[retried])
    done = _step("alpha", 10, outcome="delivered")
    await store.settle("ev", "alpha", Outcome("done"), now=T0 + 11, steps=[done])
    await store.settle("ev", "beta", Outcome("done"), now=T0 + 11)

    assert await store.event_steps("ev") == [failed, fetched, retried, done]
    assert await store.event_steps("unknown") == []


async def test_steps_are_bounded_per_delivery_and_pruned_with_the_event(store: Store) -> None:
    await store.add_event(new_event("ev"))
    extra = 5
    for n in range(MAX_STEPS_PER_DELIVERY + extra):
        await store.settle(
            "ev", "alpha", Outcome("pending", error="x"), now=T0, steps=[_step("alpha", n)]
        )
    await store.settle(
        "ev", "beta", Outcome("done"), now=T0, steps=[_step("beta", 1, outcome="delivered")]
    )

    steps = await store.event_steps("ev")
    alpha = [s.attempt for s in steps if s.sink == "alpha"]
    assert alpha == list(range(extra, MAX_STEPS_PER_DELIVERY + extra))  # the newest kept
    assert [s.sink for s in steps if s.sink != "alpha"] == ["beta"]

    await store.settle("ev", "alpha", Outcome("done"), now=T0 + 1)
    assert await store.prune(older_than=T0 + 100) == 1
    assert await store.event_steps("ev") == []
    await store.add_event(new_event("ev"))  # the same id afresh starts an empty timeline
    assert await store.event_steps("ev") == []
