"""Every row of an inbox, table by table in key order, read with plain SQL (none of the copy's
code), its values normalised so that a SQLite and a Postgres inbox holding the same data compare
equal: bytes as bytes, each row a dict by column, SQLite's rowid of an event as ``seq`` (what
Postgres calls the order events arrived in)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from tests.support.postgres import POSTGRES_URL

Rows = dict[str, list[dict[str, Any]]]
LEASES = ("lease_owner", "lease_expires_at")
#: Bookkeeping of the schema, not the inbox's data.
NOT_DATA = ("receiver_schema_migrations",)


def _value(value: Any) -> Any:
    return bytes(value) if isinstance(value, bytearray | memoryview) else value


def _row(names: list[str], values: Any, *, leases: bool) -> dict[str, Any]:
    row = {name: _value(value) for name, value in zip(names, values, strict=True)}
    if not leases:
        row.update(dict.fromkeys([n for n in LEASES if n in row]))
    return row


def sqlite_rows(path: Path, *, leases: bool = True) -> Rows:
    """The rows of the SQLite inbox at ``path``; ``leases=False``: every lease as none."""
    conn = sqlite3.connect(path)
    try:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        found: Rows = {}
        for table in names:
            info = conn.execute(f"PRAGMA table_info({table})").fetchall()
            columns = [r[1] for r in info]
            key = ", ".join(r[1] for r in sorted(info, key=lambda r: r[5]) if r[5])
            select = (["rowid"] if table == "events" else []) + columns
            names_out = (["seq"] if table == "events" else []) + columns
            rows = conn.execute(f"SELECT {', '.join(select)} FROM {table} ORDER BY {key}")
            found[table] = [_row(names_out, r, leases=leases) for r in rows]
        return found
    finally:
        conn.close()


async def postgres_rows(schema: str, *, leases: bool = True) -> Rows:
    """The rows of the Postgres inbox in ``schema`` of the test database."""
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
    try:
        columns: dict[str, list[str]] = {}
        for table, name in await conn.fetch(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = $1 ORDER BY table_name, ordinal_position",
            schema,
        ):
            if table not in NOT_DATA:
                columns.setdefault(table, []).append(name)
        found: Rows = {}
        for table, names in columns.items():
            key = await conn.fetchval(
                "SELECT string_agg(a.attname, ', ' ORDER BY k.ord) FROM pg_index i "
                "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k (attnum, ord) "
                "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
                "WHERE i.indrelid = $1::regclass AND i.indisprimary",
                table,
            )
            order = key or ", ".join(names)  # a table without a primary key: every column
            rows = await conn.fetch(f"SELECT {', '.join(names)} FROM {table} ORDER BY {order}")
            found[table] = [_row(names, r, leases=leases) for r in rows]
        return found
    finally:
        await conn.close()
