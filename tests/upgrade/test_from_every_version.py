"""An inbox of every earlier schema version upgrades whole, on SQLite and on Postgres.

Each ``tests/data/upgrades/v{N}`` inbox was made by version N's own ``receiver serve``
(``tests/data/upgrades/make_inboxes.py``): events done at every sink, pending behind a sink that
was down, dead at a sink that refused them, redelivered; where the version had them, watched
jobs, a paused lane and redelivery batches; stopped while work was pending. Here this checkout's
``receiver migrate`` (its own process) upgrades a copy, and every fact the manifest recorded of
that inbox (events and their states, deliveries with their attempts, ledgers, watches, pauses,
batches) must read the same from the upgraded one. Then this checkout's ``receiver serve``
delivers with every sink up: each delivery that was pending arrives exactly once at its sink,
nothing done or dead arrives again, dead deliveries stay dead, watched jobs stay watched, and a
paused lane sends nothing until ``receiver lanes resume``, then its backlog once.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from receiver.store.postgres.schema import SCHEMA_VERSION as POSTGRES_VERSION
from receiver.store.sqlite.schema import SCHEMA_VERSION
from tests.support.cli import run_cli
from tests.support.helpers import ReceiverProcess, free_port, wait_for, write_config
from tests.support.peers import Capture
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres
from tests.support.upgrade_inboxes import (
    Rows,
    dump_in_schema,
    dump_schema,
    inbox_facts,
    manifest,
    postgres_reader,
    postgres_tables,
    read_maybe_gzipped,
    sqlite_reader,
    sqlite_tables,
    version_dirs,
)
from tests.support.upstream import serve_upstream

API_KEY = "service_" + "e1" * 32
SECRET = "whsec_upgrade_" + "9f" * 12
assert POSTGRES_VERSION == SCHEMA_VERSION
CASES = [
    pytest.param(d, backend, id=f"{d.name}-{backend}")
    for d in version_dirs()
    for backend in ("sqlite", "postgres")
]


@dataclass
class Inbox:
    """A copy of one old inbox, and how to read it."""

    facts: dict[str, Any]  # the manifest's, for this backend
    store: dict[str, Any]  # the [store] table that names the copy
    rows: Rows
    path: Path | None = None  # SQLite
    conn: Any = None  # Postgres
    schema: str = ""

    async def version(self) -> int:
        """The schema version the inbox records."""
        if self.path is not None:
            [(version,)] = await self.rows("PRAGMA user_version")
        else:
            [(version,)] = await self.rows("SELECT max(version) FROM receiver_schema_migrations")
        return int(version)

    async def tables(self) -> dict[str, list[str]]:
        if self.path is not None:
            return sqlite_tables(self.path)
        return await postgres_tables(self.conn, self.schema)


@asynccontextmanager
async def old_inbox(directory: Path, backend: str, tmp_path: Path) -> AsyncIterator[Inbox]:
    """The version's inbox as its manifest describes it, copied where this test may change it."""
    facts = manifest(directory).get(backend)
    assert facts is not None, f"{directory.name} has no {backend} inbox: run make_inboxes.py"
    if backend == "sqlite":
        path = tmp_path / "inbox.db"
        path.write_bytes(read_maybe_gzipped(directory, "inbox.db"))
        rows, close = sqlite_reader(path)
        try:
            yield Inbox(facts, {"url": f"sqlite:///{path}"}, rows, path=path)
        finally:
            close()
        return
    require_postgres()
    import asyncpg

    dump = read_maybe_gzipped(directory, "postgres.sql").decode()
    version = int(directory.name[1:])
    async with fresh_schema() as schema:
        conn = await asyncpg.connect(POSTGRES_URL)
        try:
            await conn.execute(dump_in_schema(dump, dump_schema(version), schema))
            await conn.execute(f'SET search_path = "{schema}"')
            store = {"url": POSTGRES_URL, "schema": schema, "pool_size": 4}
            yield Inbox(facts, store, postgres_reader(conn), conn=conn, schema=schema)
        finally:
            await conn.close()


def same_facts(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What ``after`` (the upgraded inbox) lost or changed of ``before`` (the old one's manifest):
    every fact the old version could answer, each table's row count among them."""
    problems: list[str] = []
    for key, old in before.items():
        if key != "scenario":
            new = after.get(key)
            if key == "tables":
                new = {t: (new or {}).get(t) for t in old}
            problems.extend(changes(key, old, new))
    return problems


def changes(where: str, old: Any, new: Any) -> list[str]:
    """Readable differences: by key for mappings, missing and added items for lists."""
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            line
            for key in sorted(set(old) | set(new))
            for line in changes(f"{where}.{key}", old.get(key), new.get(key))
        ]
    if isinstance(old, list) and isinstance(new, list):
        lost = sorted(set(map(str, old)) - set(map(str, new)))
        added = sorted(set(map(str, new)) - set(map(str, old)))
        return [f"{where}: lost {lost[:10]} ({len(lost)}), added {added[:10]} ({len(added)})"]
    return [f"{where}: was {old!r}, now {new!r}"]


def pairs(listed: dict[str, list[str]] | None) -> set[tuple[str, str]]:
    """``{sink: [event ids]}`` as (sink, event id) pairs."""
    return {(sink, event) for sink, ids in (listed or {}).items() for event in ids}


def arrived(captures: dict[str, Capture]) -> Counter[tuple[str, str]]:
    return Counter(
        (name, r.headers.get("Service-Event-Id", ""))
        for name, capture in captures.items()
        for r in capture.requests
    )


async def pending_count(inbox: Inbox, paused: set[str]) -> int:
    marks = ", ".join(f"'{s}'" for s in paused) or "''"
    [(count,)] = await inbox.rows(
        f"SELECT count(*) FROM deliveries WHERE state = 'pending' AND sink NOT IN ({marks})"
    )
    return int(count)


async def states(inbox: Inbox, listed: dict[str, list[str]] | None) -> set[str]:
    """The states the deliveries ``listed`` are in now."""
    wanted = pairs(listed)
    rows = await inbox.rows("SELECT sink, event_id, state FROM deliveries")
    return {state for sink, event, state in rows if (sink, event) in wanted}


@pytest.mark.parametrize(("directory", "backend"), CASES)
async def test_an_old_inbox_upgrades_whole_and_its_work_goes_on(
    directory: Path, backend: str, tmp_path: Path, aiohttp_server: Any
) -> None:
    async with old_inbox(directory, backend, tmp_path) as inbox:
        old = inbox.facts
        upstream = await serve_upstream(aiohttp_server, api_key=API_KEY)
        for (body,) in await inbox.rows("SELECT body FROM events"):
            upstream.adopt(json.loads(body))
        watched = sorted(j for j, s in old.get("watches", {}).items() if s == "watching")
        for job_id in watched:
            upstream.add_job("image", status="processing", job_id=job_id, webhook=False)
        captures = {sink["name"]: Capture() for sink in manifest(directory)["sinks"]}
        for capture in captures.values():
            capture.url = str((await aiohttp_server(capture.app())).make_url("/in"))
        config = write_config(
            tmp_path / "config.toml",
            {
                "server": {"host": "127.0.0.1", "port": free_port(), "shutdown_timeout_seconds": 2},
                "admin": {"port": free_port()},
                "webhook": {"secrets": [SECRET]},
                "api": {"base_url": upstream.base_url, "api_key": API_KEY, "timeout_seconds": 5},
                "store": {**inbox.store, "retention_hours": 24 * 365 * 50},
                "worker": {
                    "poll_interval_seconds": 0.2,
                    "backoff_initial_seconds": 0.05,
                    "backoff_max_seconds": 0.5,
                },
                "pull": {"wait_seconds": 1},
                "log": {"format": "json", "level": "warning"},
                "sinks": [
                    {**sink, "url": captures[sink["name"]].url, "secret": "u" * 24}
                    for sink in manifest(directory)["sinks"]
                ],
            },
        )

        code, out, err = await run_cli("migrate", "--config", str(config), cwd=tmp_path)
        assert code == 0, err
        assert await inbox.version() == SCHEMA_VERSION, out
        after = await inbox_facts(inbox.rows, await inbox.tables())
        lost = same_facts(old, after)
        assert not lost, f"{directory.name} {backend}: the upgrade changed\n" + "\n".join(lost)

        paused = set(old.get("pauses", {}))
        deliveries = old["deliveries"]
        due = pairs(deliveries.get("pending"))
        server = ReceiverProcess(config)
        started = time.time()
        server.start()
        try:
            await server.wait_ready()

            async def delivered(expected: set[tuple[str, str]], held: set[str]) -> bool:
                got = arrived(captures)
                return all(got[p] for p in expected) and await pending_count(inbox, held) == 0

            sent_now = {p for p in due if p[0] not in paused}
            await wait_for(lambda: delivered(sent_now, paused), 60, 0.1, "the pending deliveries")
            assert arrived(captures) == Counter(sent_now), "sent other than the pending, once each"
            assert await states(inbox, deliveries.get("dead")) == {"dead"}

            if watched:

                async def polled() -> bool:
                    rows = await inbox.rows("SELECT job_id, state, last_polled_at FROM watches")
                    now = {j: (s, t) for j, s, t in rows if j in watched}
                    return all(t is not None and t > started for _, t in now.values())

                await wait_for(polled, 20, 0.1, "the watched jobs to be polled again")
                still = dict(await inbox.rows("SELECT job_id, state FROM watches"))
                assert {j: still[j] for j in watched} == dict.fromkeys(watched, "watching")

            if paused:
                kept = await inbox.rows("SELECT sink FROM lanes WHERE hold_since IS NOT NULL")
                assert {s for (s,) in kept} == paused
                for sink in sorted(paused):
                    code, _, err = await run_cli(
                        "lanes", "resume", sink, "--config", str(config), cwd=tmp_path
                    )
                    assert code == 0, err
                await wait_for(lambda: delivered(due, set()), 60, 0.1, "the paused lanes' backlog")
                assert arrived(captures) == Counter(due), "sent other than the pending, once each"
            assert await states(inbox, deliveries.get("dead")) == {"dead"}
            assert await states(inbox, deliveries.get("pending")) == {"done"}
        finally:
            server.stop()


def test_every_earlier_schema_version_has_its_inboxes() -> None:
    """A new schema version needs the inbox of the one before it: make_inboxes.py makes it."""
    found = {int(d.name[1:]): manifest(d) for d in version_dirs()}
    assert sorted(found) == list(range(1, SCHEMA_VERSION)), (
        "run tests/data/upgrades/make_inboxes.py for the versions missing"
    )
    for version, made in found.items():
        assert made["schema_version"] == version
        assert {"sqlite", "postgres"} <= set(made), f"v{version} lacks an inbox"
