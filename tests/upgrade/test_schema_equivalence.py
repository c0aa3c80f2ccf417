"""The schema an old inbox reaches through the migrations is the schema a new inbox gets.

Each inbox of ``tests/data/upgrades`` (made by that version's own code, from version 1 on) is
upgraded by this checkout's store, and its schema is described as the databases themselves
report it: tables, columns (name, type, nullability, default), indexes (columns, uniqueness,
partial WHERE), constraints (primary and foreign keys, checks, unique) and, on Postgres, storage
parameters. The description must equal that of an inbox this checkout creates from nothing; on
a difference the test prints both as a unified diff, one line per fact.
"""

from __future__ import annotations

import difflib
import re
import sqlite3
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from receiver.config.settings import StoreSettings
from receiver.store.postgres import PostgresStore
from receiver.store.sqlite import SqliteStore
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres, store_settings
from tests.support.upgrade_inboxes import (
    dump_in_schema,
    dump_schema,
    manifest,
    read_maybe_gzipped,
    version_dirs,
)

VERSIONS = [pytest.param(d, id=d.name) for d in version_dirs()]


def normal(sql: str | None) -> str:
    """SQL text without comments, in lower case, one space between words, none inside parens."""
    text = re.sub(r"--[^\n]*", " ", sql or "").lower()
    text = re.sub(r"\s+", " ", text).strip()
    return re.sub(r"\(\s+", "(", re.sub(r"\s+\)", ")", text))


def checks(create: str) -> list[str]:
    """The CHECK clauses of a CREATE TABLE statement (normalised), balanced parentheses each."""
    found, text = [], normal(create)
    for match in re.finditer(r"\bcheck\s*\(", text):
        depth, start = 0, match.end() - 1
        for end in range(start, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                found.append(text[start : end + 1])
                break
    return sorted(found)


def sqlite_schema(path: Path) -> list[str]:
    """One line per fact of the SQLite file's schema, sorted."""
    conn = sqlite3.connect(path)
    facts: list[str] = []
    try:
        master = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
        ).fetchall()
        for kind, name, table, sql in master:
            if kind == "table":
                facts.append(f"table {name}: without rowid={'without rowid' in normal(sql)}")
                facts.extend(f"table {name}: {c}" for c in checks(sql))
                for _, col, type_, notnull, default, pk in conn.execute(
                    f"PRAGMA table_info({name})"
                ):
                    facts.append(
                        f"column {name}.{col}: {type_.upper()} notnull={notnull} "
                        f"default={default} pk={pk}"
                    )
                for fk in conn.execute(f"PRAGMA foreign_key_list({name})"):
                    _, seq, parent, col, to, on_update, on_delete, match = fk
                    facts.append(
                        f"foreign key {name}.{col} -> {parent}.{to} #{seq}: "
                        f"on update {on_update} on delete {on_delete} match {match}"
                    )
                for _, index, unique, origin, partial in conn.execute(f"PRAGMA index_list({name})"):
                    cols = [c[2] for c in conn.execute(f"PRAGMA index_info({index})")]
                    facts.append(
                        f"index {name}.{'(' + origin + ')' if origin != 'c' else index}: "
                        f"{cols} unique={unique} partial={partial}"
                    )
            elif kind == "index" and sql is not None:
                where = normal(sql).partition(" where ")[2]
                facts.append(f"index {table}.{name}: where {where or '-'}")
            else:
                facts.append(f"{kind} {name} on {table}: {normal(sql)}")
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        facts.append(f"user_version {version}")
    finally:
        conn.close()
    return sorted(facts)


async def postgres_schema(conn: Any, schema: str) -> list[str]:
    """One line per fact of the Postgres schema, its name left out, sorted."""

    def local(text: str | None) -> str:
        return (text or "").replace(f'"{schema}".', "").replace(f"{schema}.", "")

    facts: list[str] = []
    for table, options in await conn.fetch(
        "SELECT c.relname, c.reloptions FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')",
        schema,
    ):
        facts.append(f"table {table}: options {sorted(options or [])}")
    for row in await conn.fetch(
        "SELECT table_name, column_name, data_type, is_nullable, column_default, collation_name,"
        " is_identity, identity_generation FROM information_schema.columns"
        " WHERE table_schema = $1",
        schema,
    ):
        table, column, type_, nullable, default, collation, identity, generation = row
        facts.append(
            f"column {table}.{column}: {type_} nullable={nullable} default={local(default)} "
            f"collation={collation} identity={identity}/{generation}"
        )
    for table, index, definition in await conn.fetch(
        "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = $1", schema
    ):
        facts.append(f"index {table}.{index}: {local(definition)}")
    for table, name, kind, definition in await conn.fetch(
        "SELECT c.relname, k.conname, k.contype::text, pg_get_constraintdef(k.oid)"
        " FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1",
        schema,
    ):
        facts.append(f"constraint {table}.{name} ({kind}): {local(definition)}")
    versions = await conn.fetch(f'SELECT version FROM "{schema}".receiver_schema_migrations')
    facts.append(f"migrations {sorted(v for (v,) in versions)}")
    return sorted(facts)


def assert_same(upgraded: list[str], fresh: list[str], what: str) -> None:
    diff = list(difflib.unified_diff(fresh, upgraded, "created fresh", what, lineterm="", n=0))
    assert not diff, f"{what} differs from a fresh inbox:\n" + "\n".join(diff)


@pytest.mark.parametrize("directory", VERSIONS)
async def test_sqlite_schema_of_an_upgraded_inbox_is_the_fresh_one(
    directory: Path, tmp_path: Path
) -> None:
    schemas = []
    for path in (tmp_path / "fresh.db", tmp_path / "upgraded.db"):
        if path.name == "upgraded.db":
            path.write_bytes(read_maybe_gzipped(directory, "inbox.db"))
        store = SqliteStore(StoreSettings(url=f"sqlite:///{path}"))
        await store.open()
        await store.close()
        schemas.append(sqlite_schema(path))
    fresh, upgraded = schemas
    assert "table events: without rowid=False" in fresh
    assert_same(upgraded, fresh, f"the {directory.name} SQLite inbox upgraded")


@pytest.mark.parametrize("directory", VERSIONS)
async def test_postgres_schema_of_an_upgraded_inbox_is_the_fresh_one(directory: Path) -> None:
    require_postgres()
    assert "postgres" in manifest(directory), f"{directory.name} has no Postgres inbox"
    dump = read_maybe_gzipped(directory, "postgres.sql").decode()
    version = int(directory.name[1:])
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        async with fresh_schema() as new, fresh_schema() as old:
            for schema in (new, old):
                if schema == old:
                    await conn.execute(dump_in_schema(dump, dump_schema(version), old))
                report = await PostgresStore(store_settings(schema)).migrate()
                assert report.after == report.before + len(report.applied)
            assert_same(
                await postgres_schema(conn, old),
                await postgres_schema(conn, new),
                f"the {directory.name} Postgres inbox upgraded",
            )
    finally:
        await conn.close()
