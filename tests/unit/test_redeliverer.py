"""The Redeliverer of a running receiver: it queues stored batches step by step, wakes the
lanes, finishes batches once nothing they queued is pending, and gives intake the store while
webhooks arrive."""

from __future__ import annotations

from receiver.delivery.redelivery import Redeliverer, start
from receiver.observe.metrics import Metrics
from receiver.store.batches import RedeliveryFilter
from receiver.store.memory import MemoryStore
from receiver.store.records import Outcome
from tests.support.store_cases import T0, new_event


async def test_batches_are_queued_step_by_step_then_finished() -> None:
    store = MemoryStore()
    for i in range(5):
        await store.add_event(new_event(f"ev-{i}", sinks=("alpha",)))
        await store.settle(f"ev-{i}", "alpha", Outcome("dead", "HTTP 503"), now=T0)
    woken: list[int] = []
    metrics = Metrics()
    runner = Redeliverer(
        store=store, metrics=metrics, on_queued=lambda: woken.append(1), step=2, clock=lambda: T0
    )
    batch = await start(store, RedeliveryFilter(), created_by="t", now=T0, step=2)
    assert (batch.queued, batch.queuing) == (2, True)
    assert await runner.tick() is True  # ev-2, ev-3
    assert await runner.tick() is True  # ev-4: the last
    assert await runner.tick() is False
    assert woken and metrics.redelivery_queued._value.get() == 3
    shown = await store.redelivery(batch.id)
    assert shown is not None and (shown.queued, shown.state, shown.finished_at) == (
        5,
        "running",
        None,
    )
    for i in range(5):
        await store.settle(f"ev-{i}", "alpha", Outcome("done"), now=T0 + 1)
    await runner.tick()
    shown = await store.redelivery(batch.id)
    assert shown is not None and (shown.state, shown.progress.delivered) == ("done", 5)


def test_queuing_gives_way_while_webhooks_arrive() -> None:
    accepted = [0.0]
    runner = Redeliverer(
        store=MemoryStore(),
        metrics=Metrics(),
        on_queued=lambda: None,
        share=0.1,
        idle_share=0.5,
        intake_count=lambda: accepted[0],
    )
    assert runner._current_share() == 0.5
    accepted[0] = 3
    assert runner._current_share() == 0.1
    assert runner._current_share() == 0.5
