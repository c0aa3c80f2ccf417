"""``receiver store copy``: an inbox moved between SQLite and Postgres, as its own process.

The source inbox holds something of everything (tests/support/full_inbox.py), put there through
the store's own API. Its rows are compared with the copy's by plain SQL (tests/support/
inbox_rows.py), leases aside: they are copied cleared. A receiver started on the copy delivers
what was pending, once, and takes a webhook sent again for a copied event as a duplicate.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from receiver.config.settings import StoreSettings
from receiver.store.copy.tables import KNOWN_TABLES
from receiver.store.postgres import PostgresStore
from receiver.store.records import Outcome
from receiver.store.sqlite import SqliteStore
from receiver.store.steps import Step
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.full_inbox import fill
from tests.support.helpers import ReceiverProcess, free_port, wait_for, write_config
from tests.support.inbox_rows import postgres_rows, sqlite_rows
from tests.support.old_inbox import file_state, make_sqlite_inbox
from tests.support.peers import Capture
from tests.support.pipeline import signed
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres
from tests.support.upstream import serve_upstream

SECRET = "whsec_store_copy_" + "5a" * 12
API_KEY = "service_" + "c0" * 32
PASSWORD = "hunter2-never-shown"


def pg(schema: str) -> str:
    return f"{POSTGRES_URL}?schema={schema}"


def lite(path: Path) -> str:
    return f"sqlite:///{path}"


async def copy(*args: str) -> tuple[int | None, str, str]:
    return await run_cli("store", "copy", *args)


async def filled(path: Path, **kw: Any) -> dict[str, Any]:
    """A SQLite inbox at ``path`` holding everything; the webhook payload of each event."""
    store = SqliteStore(StoreSettings(url=lite(path)))
    await store.open()
    try:
        return await fill(store, now=time.time(), **kw)
    finally:
        await store.close()


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    require_postgres()
    async with fresh_schema() as name:
        yield name


async def schema_exists(name: str) -> bool:
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        return bool(
            await conn.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname = $1", name)
        )
    finally:
        await conn.close()


async def test_every_table_of_both_stores_is_one_the_copy_knows(
    tmp_path: Path, schema: str
) -> None:
    """A migration that adds a table fails here until the copy is told how to copy it."""
    store = SqliteStore(StoreSettings(url=lite(tmp_path / "inbox.db")))
    await store.open()
    await store.close()
    with sqlite3.connect(tmp_path / "inbox.db") as conn:
        tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    conn.close()
    assert tables == set(KNOWN_TABLES)

    await PostgresStore(StoreSettings(url=POSTGRES_URL, schema=schema)).migrate()
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        tables = {
            r[0]
            for r in await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema
            )
        }
        # The keys are compared in order on both stores: text keys must sort bytewise ("C").
        collations = await conn.fetch(
            "SELECT c.relname, a.attname, co.collname FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) "
            "JOIN pg_collation co ON co.oid = a.attcollation "
            "WHERE n.nspname = $1 AND i.indisprimary",
            schema,
        )
    finally:
        await conn.close()
    assert tables == set(KNOWN_TABLES) | {"receiver_schema_migrations"}
    assert collations and {r[2] for r in collations if r[0] != "receiver_schema_migrations"} == {
        "C"
    }


async def test_sqlite_to_postgres_and_back_keeps_every_row(tmp_path: Path, schema: str) -> None:
    source, back = tmp_path / "inbox.db", tmp_path / "back" / "inbox.db"
    await filled(source)
    before = sqlite_rows(source)
    assert all(before[table] for table in KNOWN_TABLES), {t: len(r) for t, r in before.items()}
    held = {
        t: sum(r["lease_owner"] is not None for r in rows)
        for t, rows in before.items()
        if rows and "lease_owner" in rows[0]
    }
    assert held == {"events": 1, "deliveries": 1, "watches": 1}

    code, out, err = await copy("--from", lite(source), "--to", pg(schema))
    assert code == 0, err
    assert "work anew): events 1, deliveries 1, watches 1" in out
    expected = sqlite_rows(source, leases=False)
    assert await postgres_rows(schema) == expected

    code, out, err = await copy("--from", pg(schema), "--to", lite(back), "--batch", "3")
    assert code == 0, err
    assert sqlite_rows(back) == expected
    for table in KNOWN_TABLES:
        assert f"\n{table} " in out and " ok " in out.split(f"\n{table} ", 1)[1].split("\n")[0]
    assert sqlite_rows(source) == before  # the source is only read


async def test_a_postgres_copy_numbers_new_rows_after_the_copied_ones(
    tmp_path: Path, schema: str
) -> None:
    """Identity columns are written as the source had them; the target's next ones follow."""
    await filled(tmp_path / "inbox.db")
    async with fresh_schema() as second:
        assert (await copy("--from", lite(tmp_path / "inbox.db"), "--to", pg(schema)))[0] == 0
        conn = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
        try:  # another application's table in the same schema: not the inbox's, left alone
            await conn.execute(
                "CREATE TABLE other_app (n integer); INSERT INTO other_app VALUES (1)"
            )
        finally:
            await conn.close()
        code, _out, err = await copy("--from", pg(schema), "--to", pg(second))
        assert code == 0, err
        copied = await postgres_rows(schema)
        assert copied.pop("other_app") == [{"n": 1}]
        assert await postgres_rows(second) == copied
        store = PostgresStore(StoreSettings(url=POSTGRES_URL, schema=second))
        await store.open()
        try:
            step = Step("attempt", "hook", "hook", 2, time.time(), time.time(), "delivered")
            await store.settle("ev-new", "hook", Outcome("done"), now=time.time(), steps=[step])
            steps = (await postgres_rows(second))["event_steps"]
        finally:
            await store.close()
    assert steps[-1]["event_id"] == "ev-new" and steps[-1]["seq"] == len(steps)


async def test_dry_run_counts_each_table_and_writes_nothing(tmp_path: Path, schema: str) -> None:
    source = tmp_path / "inbox.db"
    await filled(source)
    rows = sqlite_rows(source)
    for target in (pg(schema), lite(tmp_path / "new.db")):
        code, out, err = await copy("--from", lite(source), "--to", target, "--dry-run")
        assert code == 0, err
        for table in KNOWN_TABLES:
            count = f"{len(rows[table]):,}"
            assert f"{table} " in out
            assert out.split(f"\n{table} ", 1)[1].split()[:3] == [count, count, "0"], out
        assert "nothing was written (--dry-run)" in out
    assert not await schema_exists(schema) and not (tmp_path / "new.db").exists()


async def test_append_finishes_a_copy_that_stopped_part_way(tmp_path: Path, schema: str) -> None:
    source = tmp_path / "inbox.db"
    await filled(source)
    assert (await copy("--from", lite(source), "--to", pg(schema)))[0] == 0
    conn = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
    try:  # as if it had stopped: the later events gone, with their deliveries and steps
        await conn.execute("DELETE FROM events WHERE id > 'ev-m'")
        await conn.execute("DELETE FROM watches")
    finally:
        await conn.close()
    partial, files = await postgres_rows(schema), file_state(source)

    code, out, err = await copy("--from", lite(source), "--to", pg(schema))
    assert code == 1 and out == ""
    assert_one_clean_line(err)
    assert "already holds an inbox" in err and "--append" in err
    assert await postgres_rows(schema) == partial and file_state(source) == files

    code, out, err = await copy("--from", lite(source), "--to", pg(schema), "--append")
    assert code == 0, err
    assert await postgres_rows(schema) == sqlite_rows(source, leases=False)
    line = next(x for x in out.splitlines() if x.startswith("events "))
    read, written, skipped = (int(n.replace(",", "")) for n in line.split()[1:4])
    assert written == read - len(partial["events"]) and skipped == len(partial["events"]) > 0


async def test_a_receiver_on_the_copy_delivers_what_was_pending_once(
    tmp_path: Path, schema: str, aiohttp_server: Any
) -> None:
    upstream = await serve_upstream(aiohttp_server, api_key=API_KEY, seed=7)
    sinks = {"hook": Capture(), "spare": Capture()}
    for capture in sinks.values():
        capture.url = str((await aiohttp_server(capture.app())).make_url("/in"))
    source = tmp_path / "inbox.db"
    payloads = await filled(source, new_job=lambda: upstream.add_job("image", webhook=False))
    with sqlite3.connect(source) as conn:
        pending = Counter(
            conn.execute("SELECT sink, event_id FROM deliveries WHERE state = 'pending'")
        )
        events = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    conn.close()
    assert len(pending) >= 10 and max(pending.values()) == 1
    code, _out, err = await copy("--from", lite(source), "--to", pg(schema))
    assert code == 0, err

    config = write_config(
        tmp_path / "config.toml",
        {
            "server": {"host": "127.0.0.1", "port": free_port(), "shutdown_timeout_seconds": 2},
            "admin": {"port": free_port()},
            "webhook": {"secrets": [SECRET]},
            "api": {"base_url": upstream.base_url, "api_key": API_KEY, "timeout_seconds": 10},
            "store": {"url": POSTGRES_URL, "schema": schema, "pool_size": 4},
            "worker": {"poll_interval_seconds": 0.2, "backoff_initial_seconds": 0.1},
            "pull": {"wait_seconds": 2},
            "sinks": [
                {"name": name, "type": "http", "url": c.url, "secret": name[0] * 24}
                for name, c in sinks.items()
            ],
        },
    )
    server = ReceiverProcess(config)
    server.start()
    try:
        await server.wait_ready()

        def arrived() -> Counter[tuple[str, str]]:
            return Counter(
                (name, json.loads(r.body)["event"]["id"])
                for name, capture in sinks.items()
                for r in capture.requests
            )

        async def all_pending_arrived() -> bool:
            return set(arrived()) >= set(pending)

        await wait_for(all_pending_arrived, 30, 0.05, "every pending delivery")
        url = f"http://127.0.0.1:{server.public_port}/webhooks"
        async with aiohttp.ClientSession() as session:
            for event_id in ("ev-done", "ev-new", "ev-dead"):  # the upstream sends them again
                body, headers = signed(payloads[event_id], SECRET)
                async with session.post(url, data=body, headers=headers) as response:
                    assert response.status == 200, await response.text()
            # A new event, after those: once it is delivered, so would a repeat have been.
            last = upstream.add_job("image", webhook=False)
            body, headers = signed(last, SECRET)
            async with session.post(url, data=body, headers=headers) as response:
                assert response.status == 200

        async def last_arrived() -> bool:
            return {("hook", last["id"]), ("spare", last["id"])} <= set(arrived())

        await wait_for(last_arrived, 30, 0.05, "the new event's deliveries")
        assert arrived() == pending + Counter({("hook", last["id"]): 1, ("spare", last["id"]): 1})
    finally:
        server.stop()
    conn = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
    try:
        assert await conn.fetchval("SELECT count(*) FROM events") == events + 1
    finally:
        await conn.close()


async def test_bad_sources_and_targets_are_one_line_and_write_nothing(
    tmp_path: Path, schema: str
) -> None:
    source, old = tmp_path / "inbox.db", tmp_path / "old.db"
    await filled(source)
    make_sqlite_inbox(old, 7)
    files = file_state(source), file_state(old)
    closed = f"postgresql://receiver:{PASSWORD}@127.0.0.1:{free_port()}/test?schema={schema}"
    new = tmp_path / "new.db"
    cases = {
        "cannot connect: connection refused": ("--from", lite(source), "--to", closed),
        "no inbox at": ("--from", lite(tmp_path / "missing.db"), "--to", pg(schema)),
        "run `receiver migrate` on it": ("--from", lite(old), "--to", lite(new)),
        "--to sqlite": ("--from", lite(source), "--to", lite(old)),
    }
    for expected, args in cases.items():
        code, out, err = await copy(*args)
        assert code == 1 and out == "", (args, err)
        assert_one_clean_line(err)
        assert expected in err and PASSWORD not in err, err
    assert "schema version 7" in err
    assert (file_state(source), file_state(old)) == files
    assert not new.exists() and not await schema_exists(schema)


async def test_a_process_holding_the_source_open_is_named(tmp_path: Path) -> None:
    source = tmp_path / "inbox.db"
    await filled(source)
    holder = sqlite3.connect(source)
    try:
        holder.execute("SELECT count(*) FROM events").fetchall()
        code, _out, err = await copy("--from", lite(source), "--to", lite(tmp_path / "copy.db"))
    finally:
        holder.close()
    assert code == 0, err
    assert_one_clean_line(err)
    assert "warning: process" in err and "stop its receiver first" in err
    assert sqlite_rows(tmp_path / "copy.db") == sqlite_rows(source, leases=False)


async def test_the_key_check_finds_a_row_missing_and_a_row_too_many(tmp_path: Path) -> None:
    """What ends a copy with exit 1 when the target does not hold what the source does."""
    from receiver.store.copy.locations import parse_location
    from receiver.store.copy.run import TableCopy
    from receiver.store.copy.sqlite_side import SqliteSide
    from receiver.store.copy.verify import compare_keys

    source, target = tmp_path / "inbox.db", tmp_path / "copy.db"
    await filled(source)
    assert (await copy("--from", lite(source), "--to", lite(target)))[0] == 0
    sides = [SqliteSide(parse_location("--from", lite(p))) for p in (source, target)]
    for side in sides:
        await side.open()
    try:
        tables = [(await side.tables())["deliveries"] for side in sides]
        same = await compare_keys(sides[0], tables[0], sides[1], tables[1], batch=4)
        with sqlite3.connect(target) as conn:
            conn.execute("DELETE FROM deliveries WHERE event_id = 'ev-done' AND sink = 'hook'")
            conn.execute(
                "INSERT INTO deliveries (event_id, sink, state, attempts, updated_at) "
                "VALUES ('ev-new', 'zzz', 'pending', 0, 0)"
            )
        conn.close()
        changed = await compare_keys(sides[0], tables[0], sides[1], tables[1], batch=4)
    finally:
        for side in sides:
            await side.close()
    rows = len(sqlite_rows(source)["deliveries"])
    assert (same.matches, same.source_rows, same.target_rows) == (True, rows, rows)
    assert same.source_digest == same.target_digest == changed.source_digest
    assert (changed.missing, changed.extra, changed.matches) == (1, 1, False)
    assert changed.target_digest != changed.source_digest
    assert TableCopy("deliveries", rows, rows, check=same).problems(append=False) == []
    assert TableCopy("deliveries", rows, rows, check=changed).problems(append=False) == [
        "deliveries: 1 row missing on the target",
        "deliveries: 1 row on the target not in the source",
    ]
