"""The benchmarks' bulk-built inboxes are inboxes the receiver can use: written with its current
schema and rows, so a schema change that the builders miss fails here, not in a long run."""

from __future__ import annotations

import time
from pathlib import Path

from bench import backlog, web_pages
from receiver.config.settings import StoreSettings
from receiver.store.pull import outcome_key
from receiver.store.sqlite import SqliteStore


def opened(path: Path) -> SqliteStore:
    return SqliteStore(StoreSettings(url=f"sqlite:///{path}", auto_migrate=False))


async def test_a_backlog_is_pending_and_due_for_enrichment(tmp_path: Path) -> None:
    path = backlog.build(
        tmp_path / "backlog.db", 30, state="pending", body=backlog.logo_event, progress=print
    )
    assert backlog.pending(path) == 30
    store = opened(path)
    await store.open()  # the schema version matches: nothing to migrate
    try:
        counts, oldest = await store.counts()
        assert counts["pending"] == 30
        assert oldest is not None
        claimed = await store.claim_enrichment(
            owner="bench-test", limit=100, lease_seconds=30, now=time.time()
        )
        assert sorted(r.id for r in claimed) == [f"evt-{n:08d}" for n in range(30)]
        assert await store.known_outcomes(["job.completed job-00000007"]) == {
            "job.completed job-00000007"
        }
    finally:
        await store.close()


async def test_stored_events_are_done_and_their_outcomes_known(tmp_path: Path) -> None:
    path = backlog.build(
        tmp_path / "done.db", 40, state="done", body=backlog.image_event, progress=print
    )
    assert backlog.count_events(path) == 40
    store = opened(path)
    await store.open()
    try:
        counts, _oldest = await store.counts()
        assert counts["done"] == 40
        assert not counts.get("pending")
        records = await store.list(limit=100)
        keys = {outcome_key(r.event, r.job_id) for r in records}
        assert len(keys) == 40 and None not in keys
        assert await store.known_outcomes(sorted(k for k in keys if k)) == keys
    finally:
        await store.close()


async def test_the_web_benchmark_inbox_pages_like_a_real_one(tmp_path: Path) -> None:
    path = tmp_path / "web.db"
    web_pages.build(path, 400)
    store = opened(path)
    await store.open()
    try:
        counts, _oldest = await store.counts()
        assert sum(counts.values()) == 400
        assert counts["done"] > 300
        dead = await store.dead_letters()
        assert sum(group.count for group in dead) == counts.get("dead", 0) > 0
        assert {group.error for group in dead} == {"HTTP 503 from the consumer"}
    finally:
        await store.close()
