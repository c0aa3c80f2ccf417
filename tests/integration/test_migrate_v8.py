"""Schema version 8 (what a batch's deliveries were before it, and ``withdrawn``): a version 7
inbox, SQLite or Postgres, upgrades in place with every row of every table kept as it was, and
its work goes on. A batch queued before the upgrade has nothing kept for its deliveries: a
cancel leaves them to be sent, as version 7 did; a batch queued after it withdraws.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from receiver.config.settings import StoreSettings
from receiver.store import Store
from receiver.store.batches import RedeliveryFilter
from receiver.store.records import Outcome, Snapshot
from receiver.store.schema_version import SCHEMA_VERSION
from receiver.store.sqlite import SqliteStore
from receiver.store.sqlite import schema as sqlite_schema
from tests.support.old_inbox import create_postgres_schema
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres, store_settings
from tests.support.store_cases import T0, delivery, new_event, records, redeliver

V7 = 7
SNAPSHOT = Snapshot(job={"id": "job-1", "status": "completed"}, assets=(), fetched_at=T0 + 1)

# A version 7 inbox: ev-1 fetched, its alpha delivery queued by the running batch b-old, its
# beta dead; ev-2 never fetched (its job gone), dead; the alpha lane paused by an operator.
ROWS: dict[str, list[dict[str, Any]]] = {
    "events": [
        {
            "id": "ev-1",
            "event": "job.completed",
            "job_id": "job-1",
            "body": b"{}",
            "headers": "{}",
            "received_at": T0,
            "state": "pending",
            "snapshot": SNAPSHOT.to_json(),
            "fetched_at": T0 + 1,
            "enrich_attempts": 0,
            "stored_at": T0,
        },
        {
            "id": "ev-2",
            "event": "job.completed",
            "job_id": "job-2",
            "body": b"{}",
            "headers": "{}",
            "received_at": T0 + 0.5,
            "state": "dead",
            "enrich_attempts": 3,
            "enrich_error": "gave up: 404",
            "stored_at": T0 + 0.5,
        },
    ],
    "deliveries": [
        {
            "event_id": "ev-1",
            "sink": "alpha",
            "state": "pending",
            "attempts": 0,
            "next_attempt_at": T0 + 10,
            "updated_at": T0 + 10,
            "batch_id": "b-old",
        },
        {
            "event_id": "ev-1",
            "sink": "beta",
            "state": "dead",
            "attempts": 5,
            "last_error": "HTTP 503",
            "updated_at": T0 + 9.123456789,
        },
        {
            "event_id": "ev-2",
            "sink": "alpha",
            "state": "dead",
            "attempts": 0,
            "last_error": "gave up: 404",
            "updated_at": T0 + 2,
        },
    ],
    "redeliveries": [
        {
            "id": "b-old",
            "filter": RedeliveryFilter(status="any", sinks=("alpha",)).to_text(),
            "created_by": "ops",
            "created_at": T0 + 10,
            "state": "running",
            "matched": 1,
            "queued": 1,
            "cursor": "ev-2",
            "queued_at": T0 + 10,
        },
    ],
    "lanes": [
        {
            "sink": "alpha",
            "tokens": 1.0,
            "refilled_at": T0,
            "hold_since": T0 + 11,
            "hold_reason": "upgrade",
        },
    ],
}


def sqlite_v7(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        for statements in sqlite_schema.MIGRATIONS[:V7]:
            for statement in statements:
                conn.execute(statement)
        for table, rows in ROWS.items():
            for row in rows:
                names = ", ".join(row)
                marks = ", ".join("?" for _ in row)
                conn.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", list(row.values()))
        conn.commit()
        assert conn.execute("PRAGMA user_version").fetchone() == (V7,)
    finally:
        conn.close()


Columns = dict[str, list[str]]


def sqlite_columns(path: Path) -> Columns:
    """Each table's columns, as the file has them now."""
    conn = sqlite3.connect(path)
    try:
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        return {t: [c[1] for c in conn.execute(f"PRAGMA table_info({t})")] for (t,) in tables}
    finally:
        conn.close()


def sqlite_rows(path: Path, columns: Columns) -> dict[str, list[Any]]:
    """Every row of every table (those ``columns`` of it), in a stable order."""
    conn = sqlite3.connect(path)
    try:
        return {
            table: sorted(conn.execute(f"SELECT {', '.join(cols)} FROM {table}").fetchall())
            for table, cols in columns.items()
        }
    finally:
        conn.close()


async def postgres_v7(schema: str) -> None:
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        async with conn.transaction():
            await create_postgres_schema(conn, schema, V7)
            for table, rows in ROWS.items():
                for row in rows:
                    names = ", ".join(row)
                    marks = ", ".join(f"${i}" for i in range(1, len(row) + 1))
                    await conn.execute(
                        f"INSERT INTO {table} ({names}) VALUES ({marks})", *row.values()
                    )
    finally:
        await conn.close()


async def postgres_columns(conn: asyncpg.Connection, schema: str) -> Columns:
    found = await conn.fetch(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = $1 ORDER BY table_name, ordinal_position",
        schema,
    )
    columns: Columns = {}
    for table, column in found:
        columns.setdefault(table, []).append(column)
    return columns


async def postgres_rows(conn: asyncpg.Connection, columns: Columns) -> dict[str, list[Any]]:
    rows = {}
    for table, cols in columns.items():
        found = await conn.fetch(f"SELECT {', '.join(cols)} FROM {table}")
        rows[table] = sorted(tuple(r) for r in found)
    return rows


@asynccontextmanager
async def upgraded(backend: str, tmp_path: Path) -> AsyncIterator[tuple[Store, int, list[Any]]]:
    """A version 7 inbox holding :data:`ROWS`, opened by this release (which migrates it): the
    store, its schema version then, and every row of every table (its version 7 columns)
    before and after the upgrade."""
    if backend == "sqlite":
        path = tmp_path / "inbox.db"
        sqlite_v7(path)
        columns = sqlite_columns(path)
        before = sqlite_rows(path, columns)
        lite = SqliteStore(StoreSettings(url=f"sqlite:///{path}"))
        await lite.open()
        try:
            version = (await lite.pragmas())["user_version"]
            yield lite, version, [before, sqlite_rows(path, columns)]
        finally:
            await lite.close()
        return
    require_postgres()
    from receiver.store.postgres import PostgresStore

    async with fresh_schema() as schema:
        await postgres_v7(schema)
        conn = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
        try:
            columns = await postgres_columns(conn, schema)
            del columns["receiver_schema_migrations"]  # one more row: the version applied
            before = await postgres_rows(conn, columns)
            store = PostgresStore(store_settings(schema))
            await store.open()
            try:
                version = await conn.fetchval("SELECT max(version) FROM receiver_schema_migrations")
                yield store, version, [before, await postgres_rows(conn, columns)]
            finally:
                await store.close()
        finally:
            await conn.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_version_7_inbox_keeps_every_row_and_its_work_goes_on(
    backend: str, tmp_path: Path
) -> None:
    async with upgraded(backend, tmp_path) as (store, version, (before, after)):
        assert version == SCHEMA_VERSION
        assert {table: len(before[table]) for table in ROWS} == {
            "events": 2,
            "deliveries": 3,
            "redeliveries": 1,
            "lanes": 1,
        }
        assert after == before
        old = await store.redelivery("b-old")
        assert old is not None and (old.state, old.queued, old.withdrawn) == ("running", 1, 0)
        assert old.progress.pending == 1
        assert (await store.lane_states())["alpha"].hold_reason == "upgrade"

        # Nothing was kept for b-old's delivery: the cancel leaves it to be sent.
        cancelled = await store.cancel_redelivery("b-old", now=T0 + 20)
        assert (cancelled.state, cancelled.withdrawn, cancelled.progress.pending) == (
            "cancelled",
            0,
            1,
        )
        [ev1] = (await records(store, "ev-1")).values()
        assert delivery(ev1, "alpha").state == "pending"

        # A batch queued now is withdrawn by its cancel, back to the rows as they were.
        kept = await records(store, "ev-1", "ev-2")
        assert await redeliver(store, now=T0 + 30) == 2  # ev-1 beta, ev-2 alpha
        batch = (await store.redeliveries(limit=1))[0]
        assert (await store.cancel_redelivery(batch.id, now=T0 + 31)).withdrawn == 2
        assert await records(store, "ev-1", "ev-2") == kept


# How a replica of the previous release queues a delivery (its step, without ``before_batch``).
V7_REDELIVER = """
UPDATE deliveries SET state = 'pending', attempts = 0, next_attempt_at = $1, last_error = NULL,
    updated_at = $1, batch_id = $2
WHERE event_id = $3 AND sink = $4
"""


async def test_a_batch_a_previous_release_queues_beside_is_left_to_be_sent() -> None:
    """A rolling upgrade on Postgres: a replica of the previous release steps a batch after the
    migration. What an earlier batch kept in the row is not this batch's: a cancel leaves the
    delivery to be sent rather than put back a state from before that earlier batch."""
    require_postgres()
    from receiver.store.postgres import PostgresStore

    async with fresh_schema() as schema:
        store = PostgresStore(store_settings(schema))
        await store.open()
        try:
            await store.add_event(new_event("ev-1", sinks=("alpha",)))
            await store.settle("ev-1", "alpha", Outcome("dead", "HTTP 503"), now=T0 + 1)
            assert await redeliver(store, now=T0 + 2) == 1  # a batch of this release
            await store.settle("ev-1", "alpha", Outcome("dead", "HTTP 502"), now=T0 + 3)
            flt = RedeliveryFilter()
            await store.create_redelivery(flt, batch_id="old", created_by="t", now=T0 + 4)
            conn = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
            try:
                await conn.execute(V7_REDELIVER, T0 + 4, "old", "ev-1", "alpha")
            finally:
                await conn.close()

            cancelled = await store.cancel_redelivery("old", now=T0 + 5)
            assert (cancelled.withdrawn, cancelled.progress.pending) == (0, 1)
            [ev1] = (await records(store, "ev-1")).values()
            assert (delivery(ev1, "alpha").state, delivery(ev1, "alpha").attempts) == ("pending", 0)
        finally:
            await store.close()
