"""Retention (receiver.ops.retention): expired events go in short, paced steps, and a SQLite
inbox gives the space they held back to the file system."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from receiver.config.settings import StoreSettings
from receiver.errors import StoreUnavailable
from receiver.observe.metrics import Metrics
from receiver.ops import retention
from receiver.ops.retention import Retention, next_size
from receiver.store.memory import MemoryStore
from receiver.store.postgres import PostgresStore
from receiver.store.records import PruneStep
from receiver.store.retention_timing import BENCH_ENV, CYCLE_SECONDS, Timing
from receiver.store.sqlite import SqliteStore
from receiver.store.sqlite.space import AUTO_VACUUM_INCREMENTAL, vacuum
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres, store_settings
from tests.support.store_cases import T0, new_event

RETENTION = 100.0
NOW = T0 + 10_000


class StepsSeen(MemoryStore):
    """A memory inbox whose prune steps each hold the writer ``step_seconds``, after waiting
    ``wait_seconds`` for their turn; each step's limit is recorded."""

    def __init__(self, step_seconds: float, wait_seconds: float) -> None:
        super().__init__(StoreSettings(url="memory://"))
        self.step_seconds = step_seconds
        self.wait_seconds = wait_seconds
        self.limits: list[int] = []

    async def prune_step(self, *, older_than: float, limit: int) -> PruneStep:
        self.limits.append(limit)
        await asyncio.sleep(self.wait_seconds + self.step_seconds)
        done = await super().prune_step(older_than=older_than, limit=limit)
        return PruneStep(done.deleted, self.step_seconds)


def loop(store: object, metrics: Metrics | None = None) -> Retention:
    return Retention(
        store,  # type: ignore[arg-type]
        metrics or Metrics(),
        Timing(retention_seconds=RETENTION, cycle_seconds=3600),
        clock=lambda: NOW,
    )


@pytest.mark.parametrize("busy", [True, False], ids=["intake busy", "intake idle"])
async def test_a_backlog_goes_in_bounded_steps_that_leave_the_writer_free(busy: bool) -> None:
    """Steps that waited for their turn (intake writing) hold the writer at most SHARE of the
    time; steps that did not, at most IDLE_SHARE."""
    store = StepsSeen(step_seconds=0.01, wait_seconds=0.02 if busy else 0.0)
    await store.open()
    expired = 3000
    for i in range(expired):
        await store.add_event(new_event(f"old-{i}", received_at=T0 + i * 1e-3, sinks=()))
    await store.add_event(new_event("fresh", received_at=NOW - 1, sinks=()))
    await store.add_event(new_event("pending", received_at=T0))
    metrics = Metrics()

    started = time.monotonic()
    assert await loop(store, metrics).prune() == expired
    took = time.monotonic() - started

    assert store.limits[0] == retention.FIRST_STEP_EVENTS
    assert max(store.limits) <= retention.MAX_STEP_EVENTS
    assert len(store.limits) > 3, store.limits  # steps, not one statement
    # The step size follows the time held (20 ms aimed at, 10 ms held: doubling), not the
    # time waited.
    assert store.limits[1] == 2 * store.limits[0]
    # After each step but the last, the loop paused (1 / share - 1) times what it held.
    share = retention.SHARE if busy else retention.IDLE_SHARE
    pauses = (len(store.limits) - 1) * store.step_seconds * (1 / share - 1)
    assert took >= pauses, (took, pauses)
    if not busy:  # and not the busy pace
        assert took < pauses * (1 / retention.SHARE - 1) / (1 / share - 1)
    assert (await store.counts())[0] == {"pending": 1, "done": 1, "dead": 0}
    assert metrics.inbox_pruned._value.get() == expired


async def test_webhooks_taken_by_this_process_make_the_pace_the_busy_one() -> None:
    store = StepsSeen(step_seconds=0.01, wait_seconds=0.0)
    await store.open()
    for i in range(700):
        await store.add_event(new_event(f"old-{i}", received_at=T0, sinks=()))
    metrics = Metrics()
    cycle = loop(store, metrics)

    async def webhooks() -> None:  # 200 a second, as intake counts them
        while True:
            metrics.webhook_requests.labels("accepted").inc()
            await asyncio.sleep(0.005)

    arriving = asyncio.create_task(webhooks())
    try:
        started = time.monotonic()
        assert await cycle.prune() == 700  # steps of 100, 200, 400
        took = time.monotonic() - started
    finally:
        arriving.cancel()
    assert took >= 2 * 0.01 * (1 / retention.SHARE - 1), took


def test_step_sizes_follow_the_time_a_step_took_within_bounds() -> None:
    target = retention.STEP_SECONDS
    assert next_size(100, target, least=10, most=5000) == 100
    assert next_size(100, target / 10, least=10, most=5000) == 200  # at most doubling
    assert next_size(100, target * 4, least=10, most=5000) == 25
    assert next_size(100, 100.0, least=10, most=5000) == 10
    assert next_size(4000, 0.0, least=10, most=5000) == 5000


def test_the_benchmark_setting_replaces_the_retention_and_shortens_the_cycle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = StoreSettings(retention_hours=168, ledger_retention_days=28)
    assert Timing.of(store) == Timing(168 * 3600, CYCLE_SECONDS, 28 * 86400)
    monkeypatch.setenv(BENCH_ENV, "120")
    assert Timing.of(store) == Timing(120.0, 12.0, 480.0)


@pytest.fixture
async def sqlite_inbox(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = SqliteStore(StoreSettings(url=f"sqlite:///{tmp_path / 'inbox.db'}"))
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def fill(store: SqliteStore, count: int, *, received_at: float) -> None:
    body = b"x" * 2000
    await asyncio.gather(
        *(
            store.add_event(
                new_event(f"e-{received_at}-{i}", received_at=received_at, sinks=(), body=body)
            )
            for i in range(count)
        )
    )


def checkpointed_size(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return path.stat().st_size


async def test_a_new_sqlite_inbox_gives_the_space_of_pruned_events_back(
    sqlite_inbox: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention, "KEEP_FREE_BYTES", 0)
    await fill(sqlite_inbox, 3000, received_at=T0)
    await fill(sqlite_inbox, 50, received_at=NOW)
    full = checkpointed_size(sqlite_inbox.path)
    metrics = Metrics()

    pruned, given_back = await loop(sqlite_inbox, metrics).cycle()

    assert pruned == 3000
    space = await sqlite_inbox.space()
    assert space is not None and space.reclaimable
    assert space.free_bytes is not None and space.free_bytes < 64 * 4096
    assert given_back > full // 2
    assert metrics.inbox_vacuumed_bytes._value.get() == given_back
    assert checkpointed_size(sqlite_inbox.path) < full - given_back // 2
    assert (await sqlite_inbox.counts())[0]["done"] == 50


async def test_free_pages_up_to_the_slack_are_kept_for_new_rows(
    sqlite_inbox: SqliteStore,
) -> None:
    await fill(sqlite_inbox, 1000, received_at=T0)  # about 3 MB: below KEEP_FREE_BYTES
    pruned, given_back = await loop(sqlite_inbox).cycle()
    assert (pruned, given_back) == (1000, 0)
    space = await sqlite_inbox.space()
    assert space is not None and space.free_bytes is not None and space.free_bytes > 1_000_000


async def test_an_older_inbox_is_not_reclaimable_until_converted_and_keeps_every_row(
    tmp_path: Path,
) -> None:
    path = tmp_path / "inbox.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")  # as the releases before incremental vacuum made it
    conn.close()
    store = SqliteStore(StoreSettings(url=f"sqlite:///{path}"))
    await store.open()
    try:
        await fill(store, 500, received_at=T0)
        await fill(store, 20, received_at=NOW)
        space = await store.space()
        assert space is not None and not space.reclaimable
        assert await loop(store).cycle() == (500, 0)
    finally:
        await store.close()

    done = vacuum(path, lambda _line: None)
    assert done.converted and done.after < done.before
    assert not vacuum(path, lambda _line: None).converted  # once is enough
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == AUTO_VACUUM_INCREMENTAL
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 20
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    store = SqliteStore(StoreSettings(url=f"sqlite:///{path}"))
    await store.open()
    try:
        space = await store.space()
        assert space is not None and space.reclaimable
    finally:
        await store.close()


async def test_on_postgres_the_cycle_vacuums_what_it_pruned_only_without_autovacuum() -> None:
    """Where the server's autovacuum is off (this machine's), the cycle runs a plain VACUUM of
    what it pruned; where it is on, autovacuum reuses the space and the cycle leaves it be."""
    require_postgres()
    async with fresh_schema() as schema:
        store = PostgresStore(store_settings(schema))
        await store.open()
        conn = await asyncpg.connect(POSTGRES_URL)
        try:
            off = await conn.fetchval("SELECT current_setting('autovacuum')") == "off"
            for i in range(200):
                await store.add_event(new_event(f"old-{i}", received_at=T0, sinks=()))
            # VACUUM reports to the statistics at once (a backend's deletes only when idle).
            vacuumed = (
                "SELECT last_vacuum IS NOT NULL AND n_dead_tup = 0 FROM pg_stat_user_tables "
                "WHERE schemaname = $1 AND relname = 'events'"
            )
            cycle = loop(store)
            assert await cycle.prune() == 200
            assert not await conn.fetchval(vacuumed, schema)
            await cycle.reclaim()
            assert await conn.fetchval(vacuumed, schema) is off
        finally:
            await conn.close()
            await store.close()


async def test_a_step_the_database_could_not_finish_in_time_is_taken_again_smaller() -> None:
    """Past store.timeout_seconds a step is rolled back whole (StoreUnavailable): the loop goes
    on with steps a quarter the size instead of giving up the cycle."""

    class Overloaded(StepsSeen):
        async def prune_step(self, *, older_than: float, limit: int) -> PruneStep:
            if limit > 100 and -limit not in self.limits:  # once, for the first large step
                self.limits.append(-limit)
                raise StoreUnavailable("the inbox did not answer within 5 s")
            return await super().prune_step(older_than=older_than, limit=limit)

    store = Overloaded(step_seconds=0.0, wait_seconds=0.0)
    await store.open()
    for i in range(500):
        await store.add_event(new_event(f"old-{i}", received_at=T0, sinks=()))

    assert await loop(store).prune() == 500
    assert store.limits[:4] == [100, -200, 100, 200], store.limits
