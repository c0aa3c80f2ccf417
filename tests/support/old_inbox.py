"""Inboxes at an earlier schema version, for the migration tests.

An inbox at version ``k`` is made by applying the first ``k`` migrations of this release's lists
(``receiver.store.sqlite.MIGRATIONS``, ``receiver.store.postgres.MIGRATIONS``), then putting
events and their deliveries in with plain SQL, in the columns every version has: what the
receiver of that version would have written. :func:`sqlite_rows` and :func:`postgres_rows` read
those columns back, to compare an inbox before and after a migration.
"""

from __future__ import annotations

import hashlib
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import asyncpg

from receiver.store.postgres import schema as pg_schema
from receiver.store.sqlite import schema as sqlite_schema
from tests.support.postgres import POSTGRES_URL

T0 = 1_700_000_000.0
SINKS = ("alpha", "beta")
EVENT_COLUMNS = ("id", "event", "job_id", "body", "headers", "received_at", "state")
DELIVERY_COLUMNS = (
    "event_id",
    "sink",
    "state",
    "attempts",
    "next_attempt_at",
    "last_error",
    "updated_at",
)
STATES = ("pending", "done", "dead")

Rows = dict[str, list[tuple[Any, ...]]]


def event_rows(count: int) -> Rows:
    """``count`` events, pending, done and dead in turn, each with a delivery per sink in the
    same state (a dead one with its last error and attempts)."""
    events: list[tuple[Any, ...]] = []
    deliveries: list[tuple[Any, ...]] = []
    for n in range(count):
        state = STATES[n % len(STATES)]
        received = T0 + n
        events.append((f"ev-{n:06d}", "job.completed", f"job-{n}", b"{}", "{}", received, state))
        for sink in SINKS:
            error = "HTTP 503" if state == "dead" else None
            attempts = 5 if state == "dead" else 0
            deliveries.append((f"ev-{n:06d}", sink, state, attempts, received, error, received))
    return {"events": events, "deliveries": deliveries}


def _insert(table: str, columns: tuple[str, ...], marks: str) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"


def make_sqlite_inbox(path: Path, version: int, *, events: int = 5) -> Rows:
    """A SQLite inbox at ``version`` (WAL mode, as the receiver leaves it) holding ``events``
    events; the rows put in."""
    rows = event_rows(events) if version else {"events": [], "deliveries": []}
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("BEGIN")
        for statements in sqlite_schema.MIGRATIONS[:version]:
            for statement in statements:
                conn.execute(statement)
        marks = ", ".join("?" for _ in EVENT_COLUMNS)
        conn.executemany(_insert("events", EVENT_COLUMNS, marks), rows["events"])
        marks = ", ".join("?" for _ in DELIVERY_COLUMNS)
        conn.executemany(_insert("deliveries", DELIVERY_COLUMNS, marks), rows["deliveries"])
        conn.execute("COMMIT")
        assert conn.execute("PRAGMA user_version").fetchone() == (version,)
    return rows


def set_sqlite_version(path: Path, version: int) -> None:
    """Mark the inbox at ``path`` as a release with schema ``version`` would have left it."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute(f"PRAGMA user_version = {int(version)}")


def sqlite_version(path: Path) -> int:
    with closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])


def sqlite_rows(path: Path) -> Rows:
    """The events and deliveries of a SQLite inbox (the columns every version has), sorted."""
    with closing(sqlite3.connect(path)) as conn:
        return {
            "events": sorted(conn.execute(f"SELECT {', '.join(EVENT_COLUMNS)} FROM events")),
            "deliveries": sorted(
                conn.execute(f"SELECT {', '.join(DELIVERY_COLUMNS)} FROM deliveries")
            ),
        }


def sqlite_tables(path: Path) -> set[str]:
    with closing(sqlite3.connect(path)) as conn:
        found = conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'").fetchall()
    return {name for (name,) in found}


def file_state(path: Path) -> dict[str, str]:
    """Every file of the inbox at ``path`` (itself, -wal, -shm, -writer, copies) and the
    sha256 of its bytes: equal before and after means nothing was changed or left behind."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.parent.glob(f"{path.name}*"))
    }


async def create_postgres_schema(conn: asyncpg.Connection, schema: str, version: int) -> None:
    """Create ``schema`` at ``version`` on ``conn`` (the first ``version`` migrations, recorded as
    the store records them), and make it the connection's search path."""
    await conn.execute(f'CREATE SCHEMA "{schema}"')
    await conn.execute(f'SET search_path = "{schema}"')
    await conn.execute(pg_schema.CREATE_MIGRATIONS_TABLE)
    for migration in pg_schema.MIGRATIONS[:version]:
        for statement in migration.statements:
            await conn.execute(statement)
        await conn.execute(pg_schema.RECORD_MIGRATION, migration.version, migration.description)


async def make_postgres_inbox(schema: str, version: int, *, events: int = 5) -> Rows:
    """A Postgres inbox in ``schema`` (created here) at ``version`` holding ``events`` events;
    the rows put in."""
    rows = event_rows(events)
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        async with conn.transaction():
            await create_postgres_schema(conn, schema, version)
            marks = ", ".join(f"${i}" for i in range(1, len(EVENT_COLUMNS) + 1))
            await conn.executemany(_insert("events", EVENT_COLUMNS, marks), rows["events"])
            marks = ", ".join(f"${i}" for i in range(1, len(DELIVERY_COLUMNS) + 1))
            await conn.executemany(
                _insert("deliveries", DELIVERY_COLUMNS, marks), rows["deliveries"]
            )
    finally:
        await conn.close()
    return rows


async def connect_to(schema: str) -> asyncpg.Connection:
    return await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": f'"{schema}"'})


async def postgres_rows(schema: str) -> Rows:
    """The events and deliveries of a Postgres inbox (the columns every version has), sorted
    (``headers`` as text: SQLite keeps it so too)."""
    conn = await connect_to(schema)
    try:
        columns = ", ".join("headers::text" if c == "headers" else c for c in EVENT_COLUMNS)
        events = await conn.fetch(f"SELECT {columns} FROM events")
        deliveries = await conn.fetch(f"SELECT {', '.join(DELIVERY_COLUMNS)} FROM deliveries")
    finally:
        await conn.close()
    return {
        "events": sorted(tuple(r) for r in events),
        "deliveries": sorted(tuple(r) for r in deliveries),
    }


async def postgres_state(schema: str) -> dict[str, Any]:
    """What a schema holds: its tables with their columns, its indexes, and the migrations
    recorded (with when): equal before and after means nothing was written."""
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        columns = await conn.fetch(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = $1 ORDER BY 1, 2",
            schema,
        )
        indexes = await conn.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1 ORDER BY 1",
            schema,
        )
        exists = await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema
        )
        migrations: list[Any] = []
        if await conn.fetchval(
            "SELECT to_regclass($1) IS NOT NULL", f'"{schema}".receiver_schema_migrations'
        ):
            migrations = await conn.fetch(
                f'SELECT version, description, applied_at FROM "{schema}".'
                "receiver_schema_migrations ORDER BY version"
            )
    finally:
        await conn.close()
    return {
        "exists": exists,
        "columns": [tuple(r) for r in columns],
        "indexes": [tuple(r) for r in indexes],
        "migrations": [tuple(r) for r in migrations],
    }


async def postgres_version(schema: str) -> int:
    state = await postgres_state(schema)
    return max((row[0] for row in state["migrations"]), default=0)
