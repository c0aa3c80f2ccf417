"""A prune killed half way (kill -9), on SQLite and on Postgres: it resumes at the next start and
loses nothing that is not expired.

The inbox is built before ``receiver serve`` starts, with the receiver's own schema and
statements: ``EXPIRED`` processed events older than the retention (the prune's work), and among
them the events it must keep: processed ones still inside the retention, and expired ones that
are still pending or are dead, each with its deliveries. The receiver prunes at start, one batch
a transaction. The test counts the expired events left from outside (a read-only SQLite
connection, a Postgres session of its own) and SIGKILLs the process once a tenth of them are
gone; it checks that the kill really came half way (some left, some gone, each event left with
all of its deliveries) and that every survivor is as it was. Then ``receiver serve`` starts
again on the same inbox and the test waits until the prune has finished: every expired event
gone, every survivor still there with its deliveries unchanged, the restarted prune's log line
counting exactly the events the killed one had left, and on SQLite ``PRAGMA integrity_check``
saying ok.

Nothing is ever due in these inboxes (pending events wait for an enrichment retry a day away),
so the sinks are never called and no worker touches a survivor.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from receiver.store.postgres import schema as pg_schema
from receiver.store.sql.pull import BACKFILL_JOB_OUTCOMES
from receiver.store.sqlite.intake import INSERT_EVENT
from tests.support.bulk_inbox import new_inbox
from tests.support.helpers import ReceiverProcess, free_port, wait_for, write_config
from tests.support.old_inbox import DELIVERY_COLUMNS, connect_to, create_postgres_schema
from tests.support.postgres import fresh_schema, require_postgres, url_with

HOUR = 3600.0
RETENTION_HOURS = 168.0  # the default, written into the config all the same
#: Expired processed events, the prune's work: enough that pruning them takes over a second on a
#: quiet machine (the receiver paces its steps), so that a poll every 10 ms sees it half way.
EXPIRED = {"sqlite": 30_000, "postgres": 10_000}
#: One event in every ``SPREAD`` is one to keep (of each kind in turn), among the expired ones.
SPREAD = 24
SINKS = ("hook", "mirror")
SECRET = "whsec_prune_crash_" + "9c" * 12
#: Between the newest expired event (200 h old) and the oldest kept processed one (100 h old).
EXPIRED_BEFORE_AGE = 150 * HOUR

EVENT_COLUMNS = ("id", "event", "job_id", "body", "headers", "received_at", "state", "enrich_at")
INSERT_DELIVERY = (
    f"INSERT INTO deliveries ({', '.join(DELIVERY_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
# What the checks compare: every column the builder wrote (the body and headers are the same for
# every event of a kind, and their bytes are checked by the id being there with its job id).
EVENT_CHECKED = ("id", "event", "job_id", "received_at", "state", "enrich_at")

Row = tuple[Any, ...]


@dataclass
class Rows:
    """The inbox as built: the expired processed events and what must survive the prune."""

    now: float
    expired: int = 0
    events: list[Row] = field(default_factory=list)
    deliveries: list[Row] = field(default_factory=list)
    kept_events: set[Row] = field(default_factory=set)
    kept_deliveries: set[Row] = field(default_factory=set)
    jobs: int = 0

    @property
    def expired_before(self) -> float:
        return self.now - EXPIRED_BEFORE_AGE


def build_rows(expired: int) -> Rows:
    """``expired`` processed events 200 h old, and among them one in every ``SPREAD`` of four
    kinds to keep: processed 1 h and 100 h ago (inside the retention), pending (200 h old, its
    enrichment retried a day from now) and dead (200 h old, one sink given up on)."""
    rows = Rows(now=time.time())
    kept_kinds = ("recent", "retained", "pending", "dead")
    n = -1
    while rows.expired < expired:
        n += 1
        slot = n % SPREAD
        kind = kept_kinds[(n // SPREAD) % len(kept_kinds)] if slot == 0 else "expired"
        age = {"recent": 1, "retained": 100}.get(kind, 200) * HOUR
        received = rows.now - age + n * 1e-3
        event_id, job_id = f"evt-{n:07d}", f"job-{n:07d}"
        body = json.dumps(
            {"id": event_id, "object": "event", "event": "job.completed", "job_id": job_id}
        ).encode()
        state = kind if kind in ("pending", "dead") else "done"
        retry_at = rows.now + 24 * HOUR if state == "pending" else None
        event = (event_id, "job.completed", job_id, body, "{}", received, state, retry_at)
        deliveries: list[Row] = []
        for sink in SINKS:
            if state == "pending":
                delivery: Row = (event_id, sink, "pending", 0, retry_at, None, received)
            elif state == "dead" and sink == SINKS[0]:
                delivery = (event_id, sink, "dead", 12, None, "HTTP 503", received + 600)
            else:
                delivery = (event_id, sink, "done", 1, None, None, received + 1)
            deliveries.append(delivery)
        rows.events.append(event)
        rows.deliveries.extend(deliveries)
        if kind == "expired":
            rows.expired += 1
        else:
            rows.kept_events.add(checked_event(event))
            rows.kept_deliveries.update(deliveries)
    rows.jobs = len(rows.events)
    return rows


def checked_event(event: Row) -> Row:
    return tuple(event[EVENT_COLUMNS.index(c)] for c in EVENT_CHECKED)


# --- the two stores, seen from outside ---------------------------------------------------------

EXPIRED_LEFT = "SELECT count(*) FROM events WHERE state = 'done' AND received_at < {}"
# The expired events left and their deliveries: a batch deletes an event with all of its
# deliveries or neither (both counts are read in one snapshot).
EXPIRED_WITH_DELIVERIES = """
SELECT count(*), coalesce(sum(
    (SELECT count(*) FROM deliveries d WHERE d.event_id = e.id)), 0)
FROM events e WHERE e.state = 'done' AND e.received_at < {}
"""
KEPT_EVENTS = f"""
SELECT {", ".join(EVENT_CHECKED)} FROM events WHERE NOT (state = 'done' AND received_at < {{}})
"""
KEPT_DELIVERIES = f"""
SELECT {", ".join("d." + c for c in DELIVERY_COLUMNS)} FROM deliveries d
JOIN events e ON e.id = d.event_id WHERE NOT (e.state = 'done' AND e.received_at < {{}})
"""
ORPHANS = """
SELECT count(*) FROM deliveries d WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.id = d.event_id)
"""
JOBS = "SELECT count(*) FROM job_outcomes"


class Inbox:
    """One inbox, SQLite or Postgres: built before the receiver starts, read from outside."""

    backend: str
    store: dict[str, Any]

    async def build(self, rows: Rows) -> None:
        raise NotImplementedError

    async def query(self, sql: str, *params: Any) -> list[Row]:
        raise NotImplementedError

    async def after_kill(self) -> None:
        """Until nothing of the killed process can still change the inbox."""

    async def expired_left(self, rows: Rows) -> int:
        [(left,)] = await self.query(EXPIRED_LEFT.format(self.mark(1)), rows.expired_before)
        return int(left)

    async def close(self) -> None:
        pass

    def mark(self, n: int) -> str:
        raise NotImplementedError

    async def check_survivors(self, rows: Rows, when: str) -> int:
        """Every event that must survive is there, with its deliveries as built; every expired
        event left still has all of its deliveries. Returns how many expired events are left."""
        cutoff = rows.expired_before
        kept = set(await self.query(KEPT_EVENTS.format(self.mark(1)), cutoff))
        missing, extra = rows.kept_events - kept, kept - rows.kept_events
        assert not missing and not extra, (
            f"{when}: {len(missing)} events to keep are gone or changed, e.g. "
            f"{sorted(missing)[:3]}; {len(extra)} unexpected, e.g. {sorted(extra)[:3]}"
        )
        deliveries = set(await self.query(KEPT_DELIVERIES.format(self.mark(1)), cutoff))
        missing, extra = rows.kept_deliveries - deliveries, deliveries - rows.kept_deliveries
        assert not missing and not extra, (
            f"{when}: {len(missing)} deliveries of events to keep are gone or changed, e.g. "
            f"{sorted(missing)[:3]}; {len(extra)} unexpected, e.g. {sorted(extra)[:3]}"
        )
        [(left, their_deliveries)] = await self.query(
            EXPIRED_WITH_DELIVERIES.format(self.mark(1)), cutoff
        )
        assert their_deliveries == left * len(SINKS), (
            f"{when}: the {left} expired events left have {their_deliveries} deliveries, "
            f"not {len(SINKS)} each: a batch was deleted in part"
        )
        assert await self.query(ORPHANS) == [(0,)], f"{when}: deliveries without their event"
        assert await self.query(JOBS) == [(rows.jobs,)], f"{when}: the job-outcome ledger changed"
        return int(left)


class SqliteInbox(Inbox):
    backend = "sqlite"

    def __init__(self, tmp_path: Path) -> None:
        self.db = tmp_path / "inbox.db"
        self.store = {"url": f"sqlite:///{self.db}"}

    async def build(self, rows: Rows) -> None:
        """As bench/backlog.py builds an inbox (:func:`tests.support.bulk_inbox.new_inbox`): the
        receiver's migrations and event statement, bulk rows with ``synchronous = OFF``, the
        job-outcome ledger filled as its migration fills it, the WAL folded into the file; and
        incremental vacuum on, as the receiver makes a new inbox (so the restarted receiver gives
        the pruned pages back, too)."""
        with closing(new_inbox(self.db)) as conn:
            conn.execute("BEGIN")
            conn.executemany(INSERT_EVENT, rows.events)
            conn.executemany(INSERT_DELIVERY, rows.deliveries)
            conn.execute(BACKFILL_JOB_OUTCOMES)
            conn.execute("COMMIT")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def mark(self, n: int) -> str:
        return "?"

    async def query(self, sql: str, *params: Any) -> list[Row]:
        with closing(sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10)) as conn:
            return conn.execute(sql, params).fetchall()

    async def integrity(self) -> list[Row]:
        return await self.query("PRAGMA integrity_check")


class PostgresInbox(Inbox):
    backend = "postgres"

    def __init__(self, schema: str) -> None:
        self.schema = schema
        # The receiver's sessions are named, to see from outside when the killed ones are gone.
        self.name = "prune-crash-" + uuid.uuid4().hex[:8]
        self.store = {"url": url_with(application_name=self.name), "schema": schema}
        self.conn: asyncpg.Connection | None = None

    async def build(self, rows: Rows) -> None:
        """A fresh schema migrated by the receiver's own migrations, bulk rows with COPY, the
        job-outcome ledger filled as its migration fills it, and the tables analyzed (as
        autovacuum would have, long before a prune has this much to do)."""
        conn = await connect_to(self.schema)
        try:
            async with conn.transaction():
                await create_postgres_schema(conn, self.schema, pg_schema.SCHEMA_VERSION)
                await conn.copy_records_to_table(
                    "events", records=rows.events, columns=EVENT_COLUMNS, schema_name=self.schema
                )
                await conn.copy_records_to_table(
                    "deliveries",
                    records=rows.deliveries,
                    columns=DELIVERY_COLUMNS,
                    schema_name=self.schema,
                )
                await conn.execute(BACKFILL_JOB_OUTCOMES)
            await conn.execute("ANALYZE events, deliveries, job_outcomes")
        finally:
            await conn.close()

    def mark(self, n: int) -> str:
        return f"${n}"

    async def query(self, sql: str, *params: Any) -> list[Row]:
        if self.conn is None:
            self.conn = await connect_to(self.schema)
        return [tuple(r) for r in await self.conn.fetch(sql, *params)]

    async def after_kill(self) -> None:
        """A killed client's session may still be running its last batch: until Postgres has
        ended every session of the receiver, the count could still change."""

        async def gone() -> bool:
            left = await self.query(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", self.name
            )
            return left == [(0,)]

        await wait_for(gone, 30, 0.05, "the killed receiver's Postgres sessions to end")

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()


@asynccontextmanager
async def inbox_for(backend: str, tmp_path: Path) -> AsyncIterator[Inbox]:
    if backend == "sqlite":
        yield SqliteInbox(tmp_path)
        return
    require_postgres()
    async with fresh_schema() as schema:
        inbox = PostgresInbox(schema)
        try:
            yield inbox
        finally:
            await inbox.close()


def receiver_config(tmp_path: Path, store: dict[str, Any]) -> Path:
    """``receiver serve`` on the inbox, with the sinks its deliveries name (never called: nothing
    is due) and an upstream nobody listens for (never asked: nothing is enriched)."""
    return write_config(
        tmp_path / "config.toml",
        {
            "server": {"host": "127.0.0.1", "port": free_port()},
            "admin": {"port": free_port()},
            "webhook": {"secrets": [SECRET]},
            "api": {
                "base_url": f"http://127.0.0.1:{free_port()}/v1",
                "watchdog_interval_seconds": 0,
            },
            "store": {**store, "retention_hours": RETENTION_HOURS},
            "log": {"format": "json", "level": "info"},
            "sinks": [
                {
                    "name": sink,
                    "type": "http",
                    "url": f"http://127.0.0.1:{free_port()}/never",
                    "secret": sink[0] * 24,
                }
                for sink in SINKS
            ],
        },
    )


async def wait_while_running(
    proc: ReceiverProcess,
    predicate: Callable[[], Awaitable[bool]],
    timeout: float,
    interval: float,
    what: str,
) -> None:
    """:func:`wait_for`, failing at once (with the receiver's log) if the receiver exits."""

    async def check() -> bool:
        assert proc.proc is not None
        if proc.proc.poll() is not None:
            raise AssertionError(f"the receiver exited ({proc.proc.returncode}):\n{proc.log()}")
        return await predicate()

    await wait_for(check, timeout, interval, what)


def pruned_lines(proc: ReceiverProcess) -> list[dict[str, Any]]:
    """The receiver's log lines (both starts) saying how many events a prune deleted."""
    lines = [json.loads(line) for line in proc.log().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "pruned processed events"]


async def has_pruned_lines(proc: ReceiverProcess) -> bool:
    return bool(pruned_lines(proc))


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_prune_killed_half_way_resumes_and_loses_nothing_unexpired(
    tmp_path: Path, backend: str
) -> None:
    built = build_rows(EXPIRED[backend])
    async with inbox_for(backend, tmp_path) as inbox:
        await inbox.build(built)
        assert await inbox.check_survivors(built, "as built") == built.expired
        proc = ReceiverProcess(receiver_config(tmp_path, inbox.store))
        try:
            # The first start prunes; killed once a tenth of the expired events are gone.
            proc.start()

            async def under_way() -> bool:
                return await inbox.expired_left(built) <= built.expired * 0.9

            await wait_while_running(proc, under_way, 60, 0.01, "the prune to be under way")
            proc.kill()
            await inbox.after_kill()

            left = await inbox.check_survivors(built, "right after the kill")
            assert left > 0, (
                f"the prune had deleted all {built.expired} expired events before the kill: "
                "nothing was interrupted (raise EXPIRED so that pruning takes longer)"
            )
            assert left < built.expired, "no expired event was pruned before the kill"
            if isinstance(inbox, SqliteInbox):
                assert await inbox.integrity() == [("ok",)], "the inbox is damaged after the kill"

            # Started again on the same inbox: the prune resumes and finishes.
            proc.start()

            async def pruned() -> bool:
                return await inbox.expired_left(built) == 0

            await wait_while_running(proc, pruned, 120, 0.1, "the prune to finish after restart")
            assert await inbox.check_survivors(built, "after the prune resumed") == 0
            # The resumed prune deleted exactly the expired events the killed one had left (the
            # killed one never got to the line it logs at the end).
            await wait_while_running(
                proc, lambda: has_pruned_lines(proc), 30, 0.05, "the prune's log line"
            )
            counts = [line.get("count") for line in pruned_lines(proc)]
            assert counts == [left], f"pruned counts logged {counts}, not [{left}]:\n{proc.log()}"
            code = proc.terminate(30)
            assert code == 0, f"the restarted receiver exited with {code}:\n{proc.log()}"
            # And as the receiver left it (on SQLite, after giving free pages back, or during).
            assert await inbox.check_survivors(built, "after the receiver stopped") == 0
            if isinstance(inbox, SqliteInbox):
                assert await inbox.integrity() == [("ok",)], "the inbox is damaged"
        finally:
            proc.stop()
