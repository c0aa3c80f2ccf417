"""Operating through an incident, alike on every store backend (memory, SQLite, Postgres):
redelivery batches (selection by each filter, steps, progress, cancel, two replicas) and lanes
an operator pauses and resumes (seen by every replica, kept across a restart).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from receiver.store import Outcome, Store
from receiver.store.batches import RedeliveryFilter, UnknownBatch
from receiver.store.lanes_model import LanePolicy
from tests.support import store_contract as contract
from tests.support.store_cases import T0, new_event, states

backend = contract.backend
open_backend = contract.open_backend
store = contract.store
on_shared_inboxes = contract.on_shared_inboxes
enriched, claim = contract.enriched, contract.claim

NOW = T0 + 1000


async def fill(store: Store) -> None:
    """ev-0 .. ev-5, one a minute; ev-0/1/2 job.failed on job-a; alpha dead on even ones (ev-4
    with another error), beta done on ev-0/1, pending and failing on ev-2, pending on ev-3."""
    for i in range(6):
        name = "job.failed" if i < 3 else "job.completed"
        event = new_event(f"ev-{i}", received_at=T0 + 60 * i, event=name)
        await store.add_event(event.__class__(**{**event.__dict__, "job_id": _job(i)}))
        await enriched(store, f"ev-{i}")
    for i in (0, 2, 4):
        error = "HTTP 410" if i == 4 else "HTTP 503"
        await store.settle(f"ev-{i}", "alpha", Outcome("dead", error), now=T0 + 500)
    for i in (1, 3, 5):
        await store.settle(f"ev-{i}", "alpha", Outcome("done"), now=T0 + 500)
    for i in (0, 1, 4, 5):
        await store.settle(f"ev-{i}", "beta", Outcome("done"), now=T0 + 500)
    retry = Outcome("pending", "timeout", next_attempt_at=T0 + 5000)
    await store.settle("ev-2", "beta", retry, now=T0 + 500)


def _job(i: int) -> str:
    return "job-a" if i < 3 else f"job-{i}"


async def selected(store: Store, **fields: Any) -> list[tuple[str, str]]:
    """Run a whole batch with these filter fields in steps of 2 events; the deliveries it
    queued, (event id, sink)."""
    if "sinks" in fields:
        fields["sinks"] = tuple(fields["sinks"])
    flt = RedeliveryFilter(**fields)
    preview = await store.preview_redelivery(flt, now=NOW, sample=100)
    before = {(e, d.sink): d.state for e in _ids() for d in await _deliveries(store, e)}
    batch = await store.create_redelivery(
        flt, batch_id="b-" + repr(fields), created_by="t", now=NOW
    )
    assert batch.matched == preview.matched
    while (await store.step_redelivery(batch.id, limit=2, now=NOW)) is not None:
        pass
    done = await store.redelivery(batch.id)
    assert done is not None and done.queued_at == NOW and not done.queuing
    after = {(e, d.sink): d for e in _ids() for d in await _deliveries(store, e)}
    changed = sorted(k for k, d in after.items() if d.updated_at == NOW)
    assert done.queued == done.matched == len(changed) == preview.matched
    assert [(m.delivery.event_id, m.delivery.sink) for m in preview.sample] == changed
    for key in changed:
        d = after[key]
        assert (d.state, d.attempts, d.last_error, d.next_attempt_at) == ("pending", 0, None, NOW)
        assert before[key] != "skipped"
    return changed


def _ids() -> list[str]:
    return [f"ev-{i}" for i in range(6)]


async def _deliveries(store: Store, event_id: str) -> Any:
    record = await store.get(event_id)
    assert record is not None
    return record.deliveries


def keys(text: str) -> list[tuple[str, str]]:
    """``"ev-0:alpha ev-2:beta"`` as (event id, sink) pairs."""
    return [(k.split(":")[0], k.split(":")[1]) for k in text.split()]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, "ev-0:alpha ev-2:alpha ev-4:alpha"),
        ({"status": "done", "sinks": ["beta"]}, "ev-0:beta ev-1:beta ev-4:beta ev-5:beta"),
        ({"status": "failed"}, "ev-2:beta"),
        ({"status": "pending"}, "ev-2:beta ev-3:beta"),
        ({"status": "dead", "error": "HTTP 410"}, "ev-4:alpha"),
        (
            {"status": "any", "event": "job.failed", "sinks": ["alpha"]},
            "ev-0:alpha ev-1:alpha ev-2:alpha",
        ),
        ({"status": "any", "job_id": "job-a", "sinks": ["beta"]}, "ev-0:beta ev-1:beta ev-2:beta"),
        (
            {"status": "any", "since": T0 + 120, "until": T0 + 240},
            "ev-2:alpha ev-2:beta ev-3:alpha ev-3:beta",
        ),
        ({"status": "any", "event_id": "ev-5"}, "ev-5:alpha ev-5:beta"),
        ({"status": "dead", "since": T0 + 200}, "ev-4:alpha"),
    ],
)
async def test_a_batch_selects_by_each_filter(
    store: Store, fields: dict[str, Any], expected: str
) -> None:
    await fill(store)
    assert await selected(store, **fields) == keys(expected)


async def test_a_delivery_being_sent_or_skipped_is_never_selected(store: Store) -> None:
    await store.add_event(new_event("ev-1", sinks=("alpha", "beta", "gamma")))
    await enriched(store, "ev-1")
    await store.settle("ev-1", "gamma", Outcome("skipped", attempted=False), now=T0)
    assert await claim(store, "alpha", now=T0) == ["ev-1"]  # leased until T0 + 60
    preview = await store.preview_redelivery(RedeliveryFilter(status="any"), now=T0 + 1)
    assert [(m.delivery.sink, m.event) for m in preview.sample] == [("beta", "job.completed")]


async def test_a_preview_changes_nothing(store: Store) -> None:
    await fill(store)
    preview = await store.preview_redelivery(RedeliveryFilter(), now=NOW, sample=2)
    assert preview.matched == 3 and len(preview.sample) == 2
    assert preview.sample[0].delivery.last_error == "HTTP 503"
    assert (await store.counts())[0] == {"pending": 2, "done": 2, "dead": 2}
    assert await store.redeliveries() == []


async def test_progress_counts_follow_the_deliveries_and_done_keeps_them(store: Store) -> None:
    await fill(store)
    flt = RedeliveryFilter(status="dead")
    batch = await store.create_redelivery(flt, batch_id="b1", created_by="ops", now=NOW)
    assert (batch.state, batch.matched, batch.queued, batch.created_by) == ("running", 3, 0, "ops")
    assert await store.queuing_redeliveries() == ["b1"]
    assert await store.step_redelivery("b1", limit=2, now=NOW) == 2  # ev-0, ev-2
    assert await store.finish_redeliveries(now=NOW) == []  # still queuing
    assert await store.step_redelivery("b1", limit=2, now=NOW) == 1  # ev-4: the last
    assert await store.step_redelivery("b1", limit=2, now=NOW) is None
    assert await store.queuing_redeliveries() == []
    shown = await store.redelivery("b1")
    assert shown is not None
    assert (shown.queued, shown.progress.pending, shown.progress.delivered) == (3, 3, 0)

    await store.settle("ev-0", "alpha", Outcome("done"), now=NOW + 1)
    await store.settle("ev-2", "alpha", Outcome("dead", "HTTP 503"), now=NOW + 1)
    shown = await store.redelivery("b1")
    assert shown is not None and shown.progress.__dict__ == {
        "delivered": 1,
        "failed": 1,
        "skipped": 0,
        "pending": 1,
    }
    assert await store.finish_redeliveries(now=NOW + 2) == []
    await store.settle("ev-4", "alpha", Outcome("done"), now=NOW + 3)
    assert await store.finish_redeliveries(now=NOW + 4) == ["b1"]
    assert await store.finish_redeliveries(now=NOW + 5) == []
    # A later batch takes ev-0 again: b1's kept counts do not change.
    assert await selected(store, status="any", event_id="ev-0", sinks=["alpha"])
    listed = await store.redeliveries()
    assert len(listed) == 2
    [first] = [b for b in listed if b.id == "b1"]
    assert (first.state, first.finished_at, first.progress.delivered) == ("done", NOW + 4, 2)
    assert first.as_json()["failed"] == 1


async def test_cancel_stops_queuing_at_once(store: Store) -> None:
    await fill(store)
    await store.create_redelivery(RedeliveryFilter(), batch_id="b1", created_by="t", now=NOW)
    assert await store.step_redelivery("b1", limit=1, now=NOW) == 1  # ev-0
    assert await claim(store, "alpha", now=NOW) == ["ev-0"]  # in flight: left to complete
    cancelled = await store.cancel_redelivery("b1", now=NOW + 1)
    assert (cancelled.state, cancelled.cancelled_at, cancelled.queued) == ("cancelled", NOW + 1, 1)
    assert (cancelled.withdrawn, cancelled.progress.pending) == (0, 1)
    assert await store.step_redelivery("b1", limit=10, now=NOW + 2) is None
    assert await store.queuing_redeliveries() == []
    record = await store.get("ev-2")
    assert record is not None and states(record)["alpha"] == "dead"
    # The send in flight completes; then it is closed, still cancelled, its counts kept.
    await store.settle("ev-0", "alpha", Outcome("done"), now=NOW + 3)
    assert await store.finish_redeliveries(now=NOW + 4) == ["b1"]
    closed = await store.redelivery("b1")
    assert closed is not None
    assert (closed.state, closed.finished_at, closed.progress.delivered) == (
        "cancelled",
        NOW + 4,
        1,
    )
    assert (await store.cancel_redelivery("b1", now=NOW + 5)).state == "cancelled"
    with pytest.raises(UnknownBatch):
        await store.cancel_redelivery("nope", now=NOW)
    assert await store.redelivery("nope") is None
    assert await store.step_redelivery("nope", limit=1, now=NOW) is None


async def test_a_redelivered_event_without_its_job_fetches_it_first(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    await store.fail_enrichment("ev-1", error="gave up: 404", retry_at=None, now=T0)
    assert await contract.enrich_ids(store, now=NOW) == []
    await store.create_redelivery(RedeliveryFilter(), batch_id="b1", created_by="t", now=NOW)
    assert await store.step_redelivery("b1", limit=5, now=NOW) == 2
    assert await contract.enrich_ids(store, now=NOW) == ["ev-1"]


@on_shared_inboxes
async def test_two_replicas_step_one_batch_and_queue_each_delivery_once(
    open_backend: contract.StoreFactory,
) -> None:
    first, second = await open_backend(), await open_backend()
    events = [f"ev-{i:03d}" for i in range(120)]
    for event_id in events:
        await first.add_event(new_event(event_id))
        await first.settle(event_id, "alpha", Outcome("dead", "HTTP 503"), now=T0 + 1)
    await first.create_redelivery(RedeliveryFilter(), batch_id="b1", created_by="t", now=NOW)

    async def replica(store: Store) -> int:
        total = 0
        while (count := await store.step_redelivery("b1", limit=7, now=NOW)) is not None or (
            "b1" in await store.queuing_redeliveries()
        ):
            total += count or 0
            await asyncio.sleep(0)
        return total

    counts = await asyncio.gather(replica(first), replica(second))
    assert sum(counts) == 120
    batch = await second.redelivery("b1")
    assert batch is not None and (batch.queued, batch.matched, batch.progress.pending) == (
        120,
        120,
        120,
    )
    # Each delivery is sent once: claimed by one replica or the other, never both.
    for event_id in events:
        await contract.enriched(first, event_id, now=NOW)
    taken = await claim(first, limit=80, now=NOW) + await claim(
        second, owner="w2", limit=80, now=NOW
    )
    assert sorted(taken) == events


# -- lane pauses --------------------------------------------------------------------------------


async def test_a_paused_lane_sends_nothing_and_keeps_everything(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    await enriched(store, "ev-1")
    pause = await store.pause_lane("alpha", until=None, reason="consumer down", now=T0)
    assert (pause.since, pause.until, pause.reason) == (T0, None, "consumer down")
    assert await claim(store, "alpha", now=T0 + 1) == []
    assert await claim(store, "beta", now=T0 + 1) == ["ev-1"]  # other lanes go on
    await store.add_event(new_event("ev-2"))  # stored, waiting
    await enriched(store, "ev-2")
    assert await claim(store, "alpha", now=T0 + 3600) == []
    record = await store.get("ev-1")
    assert record is not None and record.deliveries[0].attempts == 0
    # Pausing again changes its end and reason, not since when.
    again = await store.pause_lane("alpha", until=T0 + 7200, reason="still down", now=T0 + 60)
    assert (again.since, again.until) == (T0, T0 + 7200)
    state = (await store.lane_states())["alpha"]
    assert state.pause(T0 + 61) == again
    resumed = await store.resume_lane("alpha", now=T0 + 3601)
    assert resumed == again
    assert await claim(store, "alpha", now=T0 + 3601) == ["ev-1", "ev-2"]
    assert (await store.lane_states())["alpha"].pause(T0 + 3601) is None
    assert await store.resume_lane("alpha", now=T0 + 3602) is None


async def test_a_pause_for_a_while_ends_by_itself(store: Store) -> None:
    await store.add_event(new_event("ev-1"))
    await enriched(store, "ev-1")
    policy = LanePolicy(sink="alpha", rate=1.0, burst=1.0)
    await store.pause_lane("alpha", until=T0 + 600, reason=None, now=T0)
    got = await store.claim_deliveries(policy, owner="w", limit=5, lease_seconds=60, now=T0 + 1)
    assert got.deliveries == () and got.held_until == T0 + 600
    assert await claim(store, "alpha", now=T0 + 601, policy=policy) == ["ev-1"]


@on_shared_inboxes
async def test_a_pause_is_seen_by_another_replica_and_survives_a_restart(
    open_backend: contract.StoreFactory,
) -> None:
    first, second = await open_backend(), await open_backend()
    await first.add_event(new_event("ev-1"))
    await enriched(first, "ev-1")
    await first.claim_deliveries(LanePolicy("alpha"), owner="w", limit=0, lease_seconds=1, now=T0)
    await first.pause_lane("alpha", until=None, reason="maintenance", now=T0)
    assert await claim(second, "alpha", now=T0 + 1) == []
    await first.close()
    await second.close()
    reopened = await open_backend()
    assert (await reopened.lane_states())["alpha"].pause(T0 + 99).reason == "maintenance"  # type: ignore[union-attr]
    assert await claim(reopened, "alpha", now=T0 + 100) == []
    await reopened.resume_lane("alpha", now=T0 + 101)
    assert await claim(reopened, "alpha", now=T0 + 102) == ["ev-1"]
