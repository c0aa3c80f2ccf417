"""What the soak reads of its Postgres schema: each table's size, live and dead rows and
(auto)vacuums, and the server's autovacuum settings."""

from __future__ import annotations

from typing import Any

from bench.ingest.__main__ import POSTGRES_URL

#: The tables sampled one by one (every table of the schema is summed too).
PG_TABLES = ("events", "deliveries")
PG_SIZES = """
SELECT c.relname, pg_total_relation_size(c.oid) AS bytes
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')
"""
PG_STATS = """
SELECT relname, n_live_tup, n_dead_tup, last_autovacuum, autovacuum_count, last_vacuum,
       vacuum_count
FROM pg_stat_user_tables WHERE schemaname = $1
"""
PG_SETTINGS = """
SELECT name, setting FROM pg_settings WHERE name IN ('autovacuum', 'autovacuum_naptime',
    'autovacuum_vacuum_scale_factor', 'autovacuum_vacuum_threshold', 'track_counts')
"""
PG_OPTIONS = """
SELECT c.relname, c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind = 'r'
"""


async def pg_connect() -> Any:
    import asyncpg

    return await asyncpg.connect(POSTGRES_URL, timeout=5)


async def postgres_answers() -> str | None:
    """None when PostgreSQL answers at POSTGRES_URL, else why not."""
    try:
        conn = await pg_connect()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    await conn.close()
    return None


async def pg_tables(conn: Any, schema: str) -> dict[str, dict[str, Any]]:
    """Each table of ``schema``: bytes, live and dead rows, last (auto)vacuum and counts."""
    tables: dict[str, dict[str, Any]] = {}
    for row in await conn.fetch(PG_SIZES, schema):
        tables[row["relname"]] = {"bytes": int(row["bytes"])}
    for row in await conn.fetch(PG_STATS, schema):
        tables.setdefault(row["relname"], {"bytes": 0}).update(
            live=int(row["n_live_tup"]),
            dead=int(row["n_dead_tup"]),
            last_autovacuum=row["last_autovacuum"],
            autovacuum_count=int(row["autovacuum_count"]),
            last_vacuum=row["last_vacuum"],
            vacuum_count=int(row["vacuum_count"]),
        )
    return tables


async def autovacuum_settings(conn: Any) -> dict[str, str]:
    """The server's autovacuum settings (and ``track_counts``, which autovacuum needs)."""
    return {row["name"]: row["setting"] for row in await conn.fetch(PG_SETTINGS)}


async def table_options(conn: Any, schema: str) -> dict[str, list[str] | None]:
    """Each table's storage options (``reloptions``: per-table autovacuum settings among them)."""
    return {row["relname"]: row["reloptions"] for row in await conn.fetch(PG_OPTIONS, schema)}
