"""A cancelled redelivery batch withdraws what no lane has started to send, alike on every
store backend (memory, SQLite, Postgres): each delivery still pending and not leased goes back
exactly as it was before the batch (state, attempts, due time, last error, the batch that had
it, its event's state and enrichment), redeliverable again; a delivery in flight completes and
counts; ``withdrawn`` says how many were put back.
"""

from __future__ import annotations

from typing import Any

import pytest

from receiver.store import Outcome, Store
from receiver.store.batches import RedeliveryFilter
from receiver.store.sql import withdraw as withdrawals
from receiver.store.sql.withdraw import SqlWithdrawals
from tests.support import store_contract as contract
from tests.support.store_cases import T0, delivery, new_event, records, redeliver

backend = contract.backend
open_backend = contract.open_backend
store = contract.store
enriched, claim, enrich_ids = contract.enriched, contract.claim, contract.enrich_ids

NOW = T0 + 1000
IDS = ("ev-0", "ev-1", "ev-2", "ev-3")


async def fill(store: Store) -> None:
    """Deliveries in every state a batch takes, at times of 17 significant digits (kept
    exactly, though a JSON number of SQLite's has 15):
    ev-0 alpha dead after a retry, beta done; ev-1 alpha dead, beta skipped; ev-2 alpha
    waiting for a retry, beta done; ev-3 never fetched (its job gone): both dead."""
    for event_id in IDS:
        await store.add_event(new_event(event_id))
    await enriched(store, "ev-0", "ev-1", "ev-2")
    retry = Outcome("pending", "timeout", next_attempt_at=T0 + 7.1234567891)
    await store.settle("ev-0", "alpha", retry, now=T0 + 1.2345678912)
    await store.settle("ev-0", "alpha", Outcome("dead", "HTTP 503"), now=T0 + 2.0987654321)
    await store.settle("ev-0", "beta", Outcome("done"), now=T0 + 1.5)
    await store.settle("ev-1", "alpha", Outcome("dead", "HTTP 410"), now=T0 + 3.3)
    await store.settle("ev-1", "beta", Outcome("skipped", attempted=False), now=T0 + 3.3)
    later = Outcome("pending", "timeout", next_attempt_at=T0 + 5000.3333333333)
    await store.settle("ev-2", "alpha", later, now=T0 + 4.1111111111)
    await store.settle("ev-2", "beta", Outcome("done"), now=T0 + 4.1)
    await store.fail_enrichment("ev-3", error="gave up: 404", retry_at=None, now=T0 + 5.7)


async def test_a_batch_cancelled_before_any_lane_claims_puts_everything_back(
    store: Store,
) -> None:
    await fill(store)
    before = await records(store, *IDS)
    counts_before = (await store.counts())[0]
    assert counts_before == {"pending": 1, "done": 0, "dead": 3}

    batch = await store.create_redelivery(
        RedeliveryFilter(status="any"), batch_id="b1", created_by="t", now=NOW
    )
    assert await store.step_redelivery("b1", limit=10, now=NOW) == 7  # every one but skipped
    queued = await records(store, *IDS)
    assert {r.state for r in queued.values()} == {"pending"}
    assert queued["ev-3"].enrich_at == NOW  # its job would be fetched again first

    cancelled = await store.cancel_redelivery(batch.id, now=NOW + 1)
    assert (cancelled.state, cancelled.queued, cancelled.withdrawn) == ("cancelled", 7, 7)
    assert cancelled.progress.__dict__ == {"delivered": 0, "failed": 0, "skipped": 0, "pending": 0}
    assert cancelled.as_json()["withdrawn"] == 7
    # Exactly as before: states, attempts, due times, errors, update times, the event's state
    # and its enrichment (ev-3's job is not fetched for nothing).
    assert await records(store, *IDS) == before
    assert (await store.counts())[0] == counts_before
    assert await enrich_ids(store, now=NOW + 2) == []
    assert await claim(store, "alpha", now=NOW + 2) == []  # ev-2 waits for its own retry again

    assert await store.finish_redeliveries(now=NOW + 3) == ["b1"]
    closed = await store.redelivery("b1")
    assert closed is not None
    assert (closed.state, closed.finished_at, closed.withdrawn) == ("cancelled", NOW + 3, 7)
    assert (closed.progress.delivered, closed.progress.failed) == (0, 0)
    # Redeliverable again: a new batch takes the dead ones.
    assert await redeliver(store, now=NOW + 4) == 4
    again = await records(store, *IDS)
    assert [
        (e, d.sink) for e, r in again.items() for d in r.deliveries if d.updated_at == NOW + 4
    ] == [
        ("ev-0", "alpha"),
        ("ev-1", "alpha"),
        ("ev-3", "alpha"),
        ("ev-3", "beta"),
    ]


async def test_a_send_in_flight_at_the_cancel_completes_and_counts(store: Store) -> None:
    for event_id in IDS[:3]:
        await store.add_event(new_event(event_id, sinks=("alpha",)))
        await enriched(store, event_id)
        await store.settle(event_id, "alpha", Outcome("dead", "HTTP 503"), now=T0 + 1.5)
    before = await records(store, *IDS[:3])
    await store.create_redelivery(RedeliveryFilter(), batch_id="b1", created_by="t", now=NOW)
    assert await store.step_redelivery("b1", limit=10, now=NOW) == 3
    assert await claim(store, "alpha", limit=2, now=NOW) == ["ev-0", "ev-1"]  # leased: in flight

    cancelled = await store.cancel_redelivery("b1", now=NOW + 1)
    assert (cancelled.withdrawn, cancelled.progress.pending) == (1, 2)
    now = await records(store, *IDS[:3])
    assert now["ev-2"] == before["ev-2"]
    for event_id in ("ev-0", "ev-1"):
        d = delivery(now[event_id], "alpha")
        assert (d.state, d.last_error, d.leased_until) == ("pending", None, NOW + contract.LEASE)
    assert await claim(store, "alpha", now=NOW + 2) == []
    # Settled as any send: one delivered; one failed and waits for a retry, which is not a send
    # in flight: withdrawn as the batch is closed.
    await store.settle("ev-0", "alpha", Outcome("done"), now=NOW + 3)
    retry = Outcome("pending", "HTTP 502", next_attempt_at=NOW + 4)
    await store.settle("ev-1", "alpha", retry, now=NOW + 3)
    assert await store.finish_redeliveries(now=NOW + 5) == ["b1"]
    after = await records(store, "ev-0", "ev-1")
    assert delivery(after["ev-0"], "alpha").state == "done"
    assert after["ev-1"] == before["ev-1"]
    closed = await store.redelivery("b1")
    assert closed is not None and (closed.state, closed.withdrawn) == ("cancelled", 2)
    assert closed.progress.__dict__ == {"delivered": 1, "failed": 0, "skipped": 0, "pending": 0}
    assert (await store.cancel_redelivery("b1", now=NOW + 6)).withdrawn == 2  # closed: as it was


async def test_a_delivery_another_batch_took_goes_back_to_that_batch(store: Store) -> None:
    await store.add_event(new_event("ev-0", sinks=("alpha",)))
    await enriched(store, "ev-0")
    await store.settle("ev-0", "alpha", Outcome("dead", "HTTP 503"), now=T0 + 1.5)
    before = await records(store, "ev-0")
    await store.create_redelivery(RedeliveryFilter(), batch_id="a", created_by="t", now=NOW)
    assert await store.step_redelivery("a", limit=10, now=NOW) == 1
    under_a = await records(store, "ev-0")
    flt = RedeliveryFilter(status="pending")
    await store.create_redelivery(flt, batch_id="b", created_by="t", now=NOW + 1)
    assert await store.step_redelivery("b", limit=10, now=NOW + 1) == 1
    first = await store.redelivery("a")
    assert first is not None and first.progress.pending == 0  # it counts for b now

    assert (await store.cancel_redelivery("b", now=NOW + 2)).withdrawn == 1
    assert await records(store, "ev-0") == under_a
    first = await store.redelivery("a")
    assert first is not None and first.progress.pending == 1  # a's again
    assert (await store.cancel_redelivery("a", now=NOW + 3)).withdrawn == 1
    assert await records(store, "ev-0") == before


async def test_a_fetch_under_way_at_the_cancel_is_left_to_finish(store: Store) -> None:
    await store.add_event(new_event("ev-0"))
    await store.fail_enrichment("ev-0", error="gave up: 404", retry_at=None, now=T0 + 1)
    await store.create_redelivery(RedeliveryFilter(), batch_id="b1", created_by="t", now=NOW)
    assert await store.step_redelivery("b1", limit=10, now=NOW) == 2
    assert await enrich_ids(store, now=NOW) == ["ev-0"]  # its job is being fetched

    assert (await store.cancel_redelivery("b1", now=NOW + 1)).withdrawn == 2
    [record] = (await records(store, "ev-0")).values()
    assert {d.state for d in record.deliveries} == {"dead"}
    assert (record.state, record.enrich_attempts, record.enrich_error) == ("dead", 0, None)
    await enriched(store, "ev-0", now=NOW + 2)  # the fetch ends: nothing is pending to send
    assert await claim(store, "alpha", now=NOW + 2) == []


# A large batch is withdrawn in several transactions (the first one the cancel's own): the SQL
# stores; the memory store puts everything back at once.
in_sql_stores = pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)


async def dead_letters(store: Store, count: int) -> list[str]:
    ids = [f"ev-{i:02d}" for i in range(count)]
    for event_id in ids:
        await store.add_event(new_event(event_id, sinks=("alpha",)))
        await enriched(store, event_id)
        await store.settle(event_id, "alpha", Outcome("dead", "HTTP 503"), now=T0 + 1.5)
    return ids


@in_sql_stores
async def test_a_large_batch_is_withdrawn_in_several_transactions(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(withdrawals, "WITHDRAW_DELIVERIES", 2)
    ids = await dead_letters(store, 7)
    before = await records(store, *ids)
    await store.create_redelivery(RedeliveryFilter(), batch_id="b1", created_by="t", now=NOW)
    assert await store.step_redelivery("b1", limit=10, now=NOW) == 7
    cancelled = await store.cancel_redelivery("b1", now=NOW + 1)
    assert (cancelled.withdrawn, cancelled.progress.pending) == (7, 0)
    assert await records(store, *ids) == before


@in_sql_stores
async def test_what_a_cancel_left_to_put_back_is_never_claimed_and_is_swept(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel stopped after its first transaction (its process killed): no lane claims the
    rest meanwhile, and closing the batch puts them back."""
    monkeypatch.setattr(withdrawals, "WITHDRAW_DELIVERIES", 2)
    ids = await dead_letters(store, 5)
    before = await records(store, *ids)
    await store.create_redelivery(RedeliveryFilter(), batch_id="b1", created_by="t", now=NOW)
    assert await store.step_redelivery("b1", limit=10, now=NOW) == 5
    interrupted = SqlWithdrawals._withdraw_rest

    async def killed(self: Any, batch_id: str, now: float, *, wait: bool) -> None:
        pass

    monkeypatch.setattr(SqlWithdrawals, "_withdraw_rest", killed)
    cancelled = await store.cancel_redelivery("b1", now=NOW + 1)
    assert (cancelled.withdrawn, cancelled.progress.pending) == (2, 3)
    assert await claim(store, "alpha", now=NOW + 2) == []
    # Another batch's delivery, due after them, still goes out.
    await store.add_event(new_event("ev-new", sinks=("alpha",), received_at=NOW + 2))
    await enriched(store, "ev-new", now=NOW + 2)
    assert await claim(store, "alpha", now=NOW + 3) == ["ev-new"]

    monkeypatch.setattr(SqlWithdrawals, "_withdraw_rest", interrupted)
    assert await store.finish_redeliveries(now=NOW + 4) == ["b1"]
    closed = await store.redelivery("b1")
    assert closed is not None and (closed.withdrawn, closed.progress.pending) == (5, 0)
    assert await records(store, *ids) == before
