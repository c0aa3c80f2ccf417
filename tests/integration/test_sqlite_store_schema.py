"""What only the SQLite inbox promises, its schema: an empty or missing file migrated (by two
stores at once too), a newer schema refused (and an old one without ``auto_migrate``), the
indexes the claims, pruning and intake use, and the lanes migration of a version 1 inbox.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from receiver.errors import StoreUnavailable
from receiver.store.sqlite import SCHEMA_VERSION, SqliteStore, browse, intake, lanes
from receiver.store.sqlite import schema as sqlite_schema
from tests.support.sqlite_stores import T0, new_event, opened, settings_for

# -- schema -------------------------------------------------------------------------------------


async def test_migrates_an_empty_file_and_reopens_an_existing_one(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dirs" / "inbox.db"
    path.parent.mkdir(parents=True)
    path.touch()  # an empty file is a valid, empty SQLite database

    async with opened(path) as store:
        assert (await store.pragmas())["user_version"] == SCHEMA_VERSION
        await store.add_event(new_event("ev-1"))

    conn = sqlite3.connect(path)
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    finally:
        conn.close()
    assert {"events", "deliveries", "lanes", "events_enrich", "deliveries_due"} <= tables
    assert "events_state_received" in tables

    async with opened(path) as store:
        assert (await store.pragmas())["user_version"] == SCHEMA_VERSION
        assert await store.get("ev-1") is not None


async def test_creates_missing_parent_directories(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "inbox.db"
    async with opened(path):
        pass
    assert path.exists()


async def test_two_stores_migrating_one_new_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "inbox.db"
    first = SqliteStore(settings_for(path))
    second = SqliteStore(settings_for(path))
    try:
        await asyncio.gather(first.open(), second.open())
        assert await first.add_event(new_event("ev-1")) is True
        assert await second.add_event(new_event("ev-1")) is False
    finally:
        await first.close()
        await second.close()


async def test_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "inbox.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    store = SqliteStore(settings_for(path))
    with pytest.raises(StoreUnavailable, match="schema version 99"):
        await store.open()


async def test_without_auto_migrate_an_old_schema_is_refused(tmp_path: Path) -> None:
    store = SqliteStore(settings_for(tmp_path / "inbox.db", auto_migrate=False))
    with pytest.raises(StoreUnavailable, match="auto_migrate"):
        await store.open()


async def test_claim_and_prune_use_their_indexes(tmp_path: Path) -> None:
    path = tmp_path / "inbox.db"
    async with opened(path):
        pass
    conn = sqlite3.connect(path)
    try:
        claim = {"owner": "w", "expires": 1.0, "now": 1.0, "limit": 1}
        lane = {**claim, "sink": "alpha"}
        plans = {
            "enrich": conn.execute(
                "EXPLAIN QUERY PLAN " + lanes.SqliteLanes.CLAIM_ENRICHMENT, claim
            ).fetchall(),
            "claim": conn.execute(
                "EXPLAIN QUERY PLAN " + lanes.SqliteLanes.CLAIM_DELIVERIES, lane
            ).fetchall(),
            "prune": conn.execute(
                "EXPLAIN QUERY PLAN " + browse.SqliteBrowse.PRUNE_BATCH,
                {"older_than": 1.0, "limit": 10},
            ).fetchall(),
            "add": conn.execute(
                "EXPLAIN QUERY PLAN " + intake.SELECT_STORED, ('["a"]', '["k"]')
            ).fetchall(),
        }
    finally:
        conn.close()
    text = {name: " | ".join(row[3] for row in rows) for name, rows in plans.items()}
    assert "USING INDEX events_enrich (enrich_at<?)" in text["enrich"]
    assert "USING INDEX deliveries_due (sink=? AND next_attempt_at<?)" in text["claim"]
    assert "TEMP B-TREE" not in text["claim"] + text["enrich"]
    assert "events_state_received (state=? AND received_at<?)" in text["prune"]
    assert "SCAN events" not in text["add"]
    assert "SCAN job_outcomes" not in text["add"]


# -- the lanes migration ------------------------------------------------------------------------

V1_EVENT = (
    "INSERT INTO events (id, event, job_id, body, headers, received_at, state, next_attempt_at, "
    "lease_owner, lease_expires_at) VALUES (?, 'job.completed', 'job-1', X'7B7D', '{}', ?, ?, ?, "
    "?, ?)"
)
V1_DELIVERY = (
    "INSERT INTO deliveries (event_id, sink, state, attempts, next_attempt_at, last_error, "
    "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


async def test_a_version_1_inbox_keeps_its_events_and_enriches_the_pending_ones(
    tmp_path: Path,
) -> None:
    path = tmp_path / "inbox.db"
    conn = sqlite3.connect(path)
    try:
        for statement in sqlite_schema.SCHEMA_V1:
            conn.execute(statement)
        conn.execute(V1_EVENT, ("ev-1", T0, "pending", T0 + 5, "old-worker", T0 + 60))
        conn.execute(V1_DELIVERY, ("ev-1", "alpha", "done", 1, None, None, T0))
        conn.execute(V1_DELIVERY, ("ev-1", "beta", "pending", 2, T0 + 5, "boom", T0))
        conn.execute(V1_EVENT, ("ev-2", T0, "done", None, None, None))
        conn.execute(V1_DELIVERY, ("ev-2", "alpha", "done", 1, None, None, T0))
        conn.commit()
    finally:
        conn.close()

    async with opened(path) as store:
        assert (await store.pragmas())["user_version"] == SCHEMA_VERSION
        # The old claim is gone with the old worker; the pending event is fetched afresh.
        records = await store.claim_enrichment(owner="w", limit=5, lease_seconds=60, now=T0 + 1)
        assert [r.id for r in records] == ["ev-1"]
        beta = records[0].deliveries[1]
        assert (beta.state, beta.attempts, beta.last_error) == ("pending", 2, "boom")
        done = await store.get("ev-2")
        assert done is not None and done.state == "done" and done.snapshot is None
