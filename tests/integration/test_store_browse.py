"""The inbox page's questions, answered alike by every store backend (memory, SQLite, Postgres).

Filtered, keyset-paginated event pages; per-sink lane counts and the latest failures; dead
letters grouped by sink and error; redelivering one sink or one group.
"""

from __future__ import annotations

import pytest

from receiver.delivery.redelivery import redeliver_event
from receiver.errors import UnknownEvent
from receiver.store import Outcome, Store
from receiver.store.browse import Cursor, EventQuery
from tests.support import store_contract as contract
from tests.support.store_cases import T0, new_event, redeliver, states

# The contract suite's backends: memory, SQLite, and Postgres when it is reachable.
backend = contract.backend
open_backend = contract.open_backend
store = contract.store


def ids(records) -> list[str]:
    return [r.id for r in records]


async def fill(store: Store, count: int = 12) -> None:
    """ev-00 .. ev-NN, one a second; every third is job.failed; ev-04/05 share a timestamp."""
    for i in range(count):
        at = T0 + (i if i != 5 else 4)
        name = "job.failed" if i % 3 == 0 else "job.completed"
        sinks = ("alpha", "beta") if i % 2 == 0 else ("alpha",)
        await store.add_event(new_event(f"ev-{i:02d}", received_at=at, event=name, sinks=sinks))


async def pages(store: Store, query: EventQuery, size: int) -> list[list[str]]:
    """Every page of ``query``, newest first, following the older-page cursor."""
    out: list[list[str]] = []
    cursor = None
    while True:
        page = await store.browse(query, before=cursor, limit=size)
        if not page:
            return out
        out.append(ids(page))
        cursor = Cursor(page[-1].received_at, page[-1].id)


async def test_pages_walk_every_event_newest_first_once(store: Store) -> None:
    await fill(store)
    walked = await pages(store, EventQuery(), 5)
    assert [len(p) for p in walked] == [5, 5, 2]
    flat = [i for p in walked for i in p]
    # Same timestamp for ev-04 and ev-05: the id breaks the tie, descending.
    expected = [f"ev-{i:02d}" for i in (11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)]
    assert flat == expected
    first = await store.browse(EventQuery(), limit=3)
    assert ids(first) == expected[:3]
    assert first[0].deliveries and first[0].deliveries[0].sink == "alpha"


async def test_the_newer_page_is_the_one_before_the_cursor(store: Store) -> None:
    await fill(store)
    older = await store.browse(EventQuery(), before=Cursor(T0 + 4, "ev-05"), limit=4)
    assert ids(older) == ["ev-04", "ev-03", "ev-02", "ev-01"]
    newer = await store.browse(EventQuery(), after=Cursor(T0 + 4, "ev-04"), limit=3)
    assert ids(newer) == ["ev-07", "ev-06", "ev-05"]  # still newest first
    top = await store.browse(EventQuery(), after=Cursor(T0 + 9, "ev-09"), limit=5)
    assert ids(top) == ["ev-11", "ev-10"]


async def test_filters_combine(store: Store) -> None:
    await fill(store)
    failed = await store.browse(EventQuery(event="job.failed"))
    assert ids(failed) == ["ev-09", "ev-06", "ev-03", "ev-00"]
    beta = await store.browse(EventQuery(sink="beta"))
    assert ids(beta) == ["ev-10", "ev-08", "ev-06", "ev-04", "ev-02", "ev-00"]
    both = await store.browse(EventQuery(sink="beta", event="job.failed"))
    assert ids(both) == ["ev-06", "ev-00"]
    assert ids(await store.browse(EventQuery(ref="ev-07"))) == ["ev-07"]
    assert ids(await store.browse(EventQuery(ref="job-ev-08"))) == ["ev-08"]
    assert await store.browse(EventQuery(ref="nope")) == []
    window = await store.browse(EventQuery(since=T0 + 4, until=T0 + 7))
    assert ids(window) == ["ev-06", "ev-05", "ev-04"]
    paged = await pages(store, EventQuery(event="job.completed", until=T0 + 9), 3)
    assert paged == [["ev-08", "ev-07", "ev-05"], ["ev-04", "ev-02", "ev-01"]]


async def test_state_filters_the_event_or_with_a_sink_that_sinks_delivery(store: Store) -> None:
    await fill(store, 4)
    await store.settle("ev-02", "alpha", Outcome("dead", "HTTP 500"), now=T0 + 10)
    await store.settle("ev-02", "beta", Outcome("done"), now=T0 + 10)
    await store.settle("ev-01", "alpha", Outcome("done"), now=T0 + 10)
    assert ids(await store.browse(EventQuery(state="dead"))) == ["ev-02"]
    assert ids(await store.browse(EventQuery(state="done"))) == ["ev-01"]
    assert ids(await store.browse(EventQuery(state="pending"))) == ["ev-03", "ev-00"]
    assert ids(await store.browse(EventQuery(sink="beta", state="done"))) == ["ev-02"]
    assert ids(await store.browse(EventQuery(sink="alpha", state="dead"))) == ["ev-02"]
    assert await store.browse(EventQuery(sink="beta", state="dead")) == []


async def test_overview_counts_each_lane_and_lists_the_latest_failures(store: Store) -> None:
    await fill(store, 4)  # alpha: ev-00..03; beta: ev-00, ev-02
    now = T0 + 100
    await store.settle("ev-00", "alpha", Outcome("done"), now=T0 + 10)
    await store.settle(
        "ev-01", "alpha", Outcome("pending", "HTTP 503", next_attempt_at=now + 30), now=T0 + 20
    )
    await store.settle("ev-02", "beta", Outcome("dead", "HTTP 410"), now=T0 + 30)
    await contract.enriched(store, "ev-00", now=now)
    assert await contract.claim(store, "beta", limit=1, now=now) == ["ev-00"]  # in flight

    view = await store.overview(now=now, failing_since=T0 + 25)
    lanes = {lane.sink: lane for lane in view.lanes}
    assert set(lanes) == {"alpha", "beta"}
    alpha, beta = lanes["alpha"], lanes["beta"]
    assert (alpha.backlog, alpha.due, alpha.in_flight, alpha.failing) == (3, 2, 0, 0)
    assert alpha.oldest_due_at == T0 + 2
    assert (beta.backlog, beta.due, beta.in_flight, beta.failing) == (1, 1, 1, 1)
    assert beta.oldest_due_at == T0
    assert [(d.event_id, d.sink, d.last_error) for d in view.recent_errors] == [
        ("ev-02", "beta", "HTTP 410"),
        ("ev-01", "alpha", "HTTP 503"),
    ]
    assert len((await store.overview(now=now, failing_since=0, errors=1)).recent_errors) == 1


async def test_dead_letters_group_by_sink_and_error_and_redeliver_by_group(store: Store) -> None:
    await fill(store, 6)
    for event_id, sink, error in [
        ("ev-00", "alpha", "HTTP 500"),
        ("ev-01", "alpha", "HTTP 500"),
        ("ev-03", "alpha", "HTTP 500"),
        ("ev-02", "alpha", "timeout"),
        ("ev-02", "beta", "HTTP 500"),
    ]:
        await store.settle(event_id, sink, Outcome("dead", error), now=T0 + int(event_id[-1]))
    groups = await store.dead_letters(samples=2)
    assert [(g.sink, g.error, g.count) for g in groups] == [
        ("alpha", "HTTP 500", 3),
        ("alpha", "timeout", 1),
        ("beta", "HTTP 500", 1),
    ]
    assert groups[0].event_ids == ("ev-03", "ev-01")
    assert (groups[0].first_at, groups[0].last_at) == (T0, T0 + 3)

    assert await redeliver(store, now=T0 + 50, sinks=["alpha"], error="HTTP 500") == 3
    assert [(g.sink, g.error) for g in await store.dead_letters()] == [
        ("alpha", "timeout"),
        ("beta", "HTTP 500"),
    ]
    record = await store.get("ev-01")
    assert record is not None and record.state == "pending"
    assert await redeliver(store, now=T0 + 50, sinks=["alpha"], error="HTTP 500") == 0


async def test_redeliver_one_sink_leaves_the_others(store: Store) -> None:
    await fill(store, 1)
    await store.settle("ev-00", "alpha", Outcome("dead", "HTTP 500"), now=T0 + 5)
    await store.settle("ev-00", "beta", Outcome("done"), now=T0 + 5)
    batch = await redeliver_event(store, "ev-00", sink="alpha", created_by="tests", now=T0 + 9)
    assert batch.queued == 1
    record = await store.get("ev-00")
    assert record is not None
    assert states(record) == {"alpha": "pending", "beta": "done"}
    assert record.state == "pending"
    [alpha] = [d for d in record.deliveries if d.sink == "alpha"]
    assert (alpha.attempts, alpha.last_error, alpha.next_attempt_at) == (0, None, T0 + 9)
    with pytest.raises(UnknownEvent):
        await redeliver_event(store, "ev-00", sink="gamma", created_by="tests", now=T0)
    with pytest.raises(UnknownEvent):
        await redeliver_event(store, "nope", sink="alpha", created_by="tests", now=T0)
