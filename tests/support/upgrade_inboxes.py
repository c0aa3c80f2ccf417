"""The inboxes of earlier schema versions under ``tests/data/upgrades/v{N}/``, and what they hold.

Each version's directory has the SQLite file (``inbox.db`` or ``inbox.db.gz``), a plain-SQL dump
of a Postgres schema (``postgres.sql`` or ``.gz``, schema :func:`dump_schema`) and
``manifest.json``: the :func:`inbox_facts` of each, read when they were made by that version's
own code (``tests/data/upgrades/make_inboxes.py``). The upgrade tests read the same facts from
the migrated inbox and compare.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import sqlite3
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from tests.support.helpers import ROOT

DATA = ROOT / "tests" / "data" / "upgrades"

#: ``await rows(sql)``: the rows a query returns, as tuples.
Rows = Callable[[str], Awaitable[list[tuple[Any, ...]]]]


def version_dirs() -> list[Path]:
    """Every ``v{N}`` directory holding a manifest, oldest first."""
    found = [p for p in DATA.glob("v*") if (p / "manifest.json").exists()]
    return sorted(found, key=lambda p: int(p.name[1:]))


def manifest(directory: Path) -> dict[str, Any]:
    return dict(json.loads((directory / "manifest.json").read_text()))


def read_maybe_gzipped(directory: Path, name: str) -> bytes:
    """``name`` or ``name.gz`` of ``directory``, uncompressed."""
    plain = directory / name
    if plain.exists():
        return plain.read_bytes()
    return gzip.decompress((directory / f"{name}.gz").read_bytes())


def dump_schema(version: int) -> str:
    """The Postgres schema a version's inbox was made in (and is named in its dump)."""
    return f"receiver_upgrade_v{version}"


def dump_in_schema(sql: str, old: str, new: str) -> str:
    """A plain ``pg_dump`` of schema ``old`` as statements that make it as ``new``.

    psql's own meta-commands (``\\restrict`` and the like, one a line) are left out: the rest is
    SQL any client runs.
    """
    kept = "\n".join(line for line in sql.splitlines() if not line.startswith("\\"))
    return re.sub(rf"\b{re.escape(old)}\b", new, kept)


def digest(rows: Iterable[Iterable[Any]]) -> str:
    """sha256 of the rows, sorted, as JSON."""
    data = sorted(list(row) for row in rows)
    return hashlib.sha256(json.dumps(data, separators=(",", ":")).encode()).hexdigest()


def _bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def sqlite_reader(path: Path) -> tuple[Rows, Callable[[], None]]:
    """Rows of an SQLite file (queries only), and how to close it."""
    conn = sqlite3.connect(path)

    async def rows(sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in conn.execute(sql).fetchall()]

    return rows, conn.close


def sqlite_tables(path: Path) -> dict[str, list[str]]:
    conn = sqlite3.connect(path)
    try:
        names = conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        ).fetchall()
        return {n: [c[1] for c in conn.execute(f"PRAGMA table_info({n})")] for (n,) in names}
    finally:
        conn.close()


async def postgres_tables(conn: Any, schema: str) -> dict[str, list[str]]:
    found = await conn.fetch(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = $1 ORDER BY table_name, ordinal_position",
        schema,
    )
    tables: dict[str, list[str]] = {}
    for table, column in found:
        tables.setdefault(table, []).append(column)
    return tables


def postgres_reader(conn: Any) -> Rows:
    async def rows(sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in await conn.fetch(sql)]

    return rows


async def inbox_facts(rows: Rows, tables: dict[str, list[str]]) -> dict[str, Any]:
    """What an inbox holds, in terms every schema version since 1 can answer.

    ``tables`` maps each table to its columns (the migrations table is left out: an upgrade adds
    rows to it). Deliveries are listed by state and sink, so a test can tell which must arrive
    after an upgrade (``pending``) and which must not (``done``, ``dead``).
    """
    facts: dict[str, Any] = {}
    names = sorted(t for t in tables if t != "receiver_schema_migrations")
    facts["tables"] = {t: (await rows(f"SELECT count(*) FROM {t}"))[0][0] for t in names}
    events = await rows("SELECT id, state FROM events")
    facts["events_by_state"] = dict(sorted(Counter(s for _, s in events).items()))
    facts["events_sha256"] = digest(events)
    content = await rows("SELECT id, event, job_id, body FROM events")
    facts["event_content_sha256"] = digest(
        (i, e, j, hashlib.sha256(_bytes(b)).hexdigest()) for i, e, j, b in content
    )
    deliveries = await rows("SELECT event_id, sink, state, attempts FROM deliveries")
    by_sink: dict[str, Counter[str]] = {}
    listed: dict[str, dict[str, list[str]]] = {}
    for event_id, sink, state, _ in deliveries:
        by_sink.setdefault(sink, Counter())[state] += 1
        listed.setdefault(state, {}).setdefault(sink, []).append(event_id)
    facts["deliveries_by_sink"] = {s: dict(sorted(c.items())) for s, c in sorted(by_sink.items())}
    facts["attempts"] = sum(int(a) for *_, a in deliveries)
    facts["deliveries_sha256"] = digest(deliveries)
    facts["deliveries"] = {
        state: {sink: sorted(ids) for sink, ids in sorted(sinks.items())}
        for state, sinks in sorted(listed.items())
    }
    if "job_outcomes" in tables:
        facts["job_outcomes_sha256"] = digest(
            await rows("SELECT key, event_id, source FROM job_outcomes")
        )
    if "asset_ledger" in tables:
        facts["asset_ledger_sha256"] = digest(await rows("SELECT key, event_id FROM asset_ledger"))
    if "event_steps" in tables:
        facts["event_steps_sha256"] = digest(
            await rows("SELECT event_id, sink, kind, name, attempt, outcome FROM event_steps")
        )
    if "watches" in tables:
        facts["watches"] = dict(sorted(await rows("SELECT job_id, state FROM watches")))
    if "lanes" in tables:
        facts["lanes"] = sorted(s for (s,) in await rows("SELECT sink FROM lanes"))
    if "hold_since" in tables.get("lanes", ()):
        held = await rows("SELECT sink, hold_reason FROM lanes WHERE hold_since IS NOT NULL")
        facts["pauses"] = dict(sorted(held))
    if "redeliveries" in tables:
        batches = await rows(
            "SELECT id, state, filter, matched, queued, delivered, failed, skipped "
            "FROM redeliveries"
        )
        facts["batches"] = {
            b[0]: dict(
                zip(
                    ("state", "filter", "matched", "queued", "delivered", "failed", "skipped"),
                    b[1:],
                    strict=True,
                )
            )
            for b in sorted(batches)
        }
    return facts
