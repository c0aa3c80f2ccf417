"""The store contract, the event's trace context and timeline (receiver.store.steps): the
trace context kept with the event, each step kept with the result it belongs to, at most
``MAX_STEPS_PER_DELIVERY`` a delivery, and pruned with the event.

Part of one contract for every inbox backend: memory, SQLite, and Postgres when it is
reachable. The backends, the fixtures and the helpers are in :mod:`tests.support.store_contract`.
"""

from __future__ import annotations

import dataclasses

from receiver.store import Outcome, Store
from receiver.store.steps import MAX_STEPS_PER_DELIVERY, Step
from tests.support.store_cases import T0, new_event
from tests.support.store_contract import backend, open_backend, snapshot, store

__all__ = ["backend", "open_backend", "store"]  # fixtures, used by name


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
