"""What the SQLite inbox's layout costs an event as the inbox grows, outside the receiver.

Intake's transaction as the receiver writes it (receiver.store.sqlite.intake: its one look for
stored ids and outcomes, then one multi-row INSERT a table: job outcomes, events, deliveries),
groups of 32 events, ``synchronous = FULL``, WAL with a passive checkpoint every ``--checkpoint``
groups (the receiver's is every 500 events: 16 groups), on an empty file and on one holding
``--stored`` events (1,000,000). Each layout is the receiver's schema changed one way:

- ``current``: the schema as it is (four B-trees keyed by random ids a new event writes to: the
  event id, the job id, the delivery's (event id, sink) and the job outcome);
- ``deliveries-by-arrival``: deliveries keyed by (the event's rowid, sink), in arrival order;
- ``and-no-job-index``: that, and no index by job id (what the inbox page's and
  ``redeliver --job``'s lookups use);
- ``page-2048``: the current schema with 2 KiB pages instead of 4 KiB;
- ``no-auto-vacuum``: the current schema without incremental vacuum (no pointer-map pages);
- ``cache-512mib``: the current schema with a 512 MiB page cache, warmed with every index that
  takes random ids before the groups are written;
- ``new-file-by-day``: what an inbox split into a file a day would cost intake: new events go
  into today's file (an empty inbox), the stored events sit in an older day's file attached
  beside it, where each group's ids are looked up too (a duplicate may be days late);
- ``tables-by-day``: the same split inside one file: the stored events keep their tables
  (renamed), new events go into empty tables of their own beside them, looked up in both (SQLite
  commits a transaction over several attached WAL files atomically in each file but not across
  them, so a split that one transaction must span is safe only inside one file).

Reported: CPU time an event, empty and stored, and of it the checkpoints' (the best of two
passes each); the pages an event adds to the WAL (frames); wall time an event and stored /
empty. Every file is built in ``--dir`` (about 1.6 GB a layout) and removed after::

    python -m bench.scale.sqlite_layouts [--stored 1000000] [--groups 400] [--checkpoint 16]
        [--layouts current,deliveries-by-arrival,...] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import tempfile
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import Table, machine_note, webhook_body
from receiver.store.sqlite.intake import (
    EVENT_ROW,
    INSERT_EVENTS_HEAD,
    SELECT_STORED,
)
from receiver.store.sqlite.intake import _insert_rows as insert
from receiver.store.sqlite.pull import INSERT_OUTCOMES_HEAD, OUTCOME_ROW
from tests.support.bulk_inbox import new_inbox

GROUP = 32
FILL_CHUNK = 20_000

# Deliveries keyed by the event's rowid (arrival order), with the same indexes as the schema's.
BY_ARRIVAL = (
    "DROP INDEX deliveries_due",
    "DROP INDEX deliveries_dead",
    "DROP INDEX deliveries_failing",
    "DROP INDEX deliveries_dead_groups",
    "DROP TABLE deliveries",
    """CREATE TABLE deliveries (
        event_seq INTEGER NOT NULL, sink TEXT NOT NULL, state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at REAL, last_error TEXT,
        updated_at REAL NOT NULL, lease_owner TEXT, lease_expires_at REAL,
        PRIMARY KEY (event_seq, sink)) WITHOUT ROWID""",
    "CREATE INDEX deliveries_due ON deliveries (sink, next_attempt_at, event_seq) "
    "WHERE state = 'pending'",
    "CREATE INDEX deliveries_dead ON deliveries (event_seq) WHERE state = 'dead'",
    "CREATE INDEX deliveries_failing ON deliveries (updated_at) WHERE last_error IS NOT NULL",
    "CREATE INDEX deliveries_dead_groups ON deliveries (sink, last_error, updated_at, state) "
    "WHERE state = 'dead'",
)


@dataclass(frozen=True)
class Layout:
    """The schema changed one way: its page size, statements run after the migrations, and
    whether deliveries are keyed by the event's rowid."""

    page_size: int | None = None
    changes: tuple[str, ...] = ()
    by_arrival: bool = False
    auto_vacuum: bool = True
    cache_kib: int | None = None  # and warmed; None: SQLite's default (the receiver's)
    by_day: bool = False  # stored events in an attached file; new ones in an empty one
    tables_by_day: bool = False  # stored events in renamed tables; new ones in empty ones


LAYOUTS = {
    "current": Layout(),
    "deliveries-by-arrival": Layout(changes=BY_ARRIVAL, by_arrival=True),
    "and-no-job-index": Layout(changes=(*BY_ARRIVAL, "DROP INDEX events_job"), by_arrival=True),
    "page-2048": Layout(page_size=2048),
    "no-auto-vacuum": Layout(auto_vacuum=False),
    "cache-512mib": Layout(cache_kib=512 * 1024),
    "new-file-by-day": Layout(by_day=True),
    "tables-by-day": Layout(tables_by_day=True),
}
# The tables a new event writes to, which tables-by-day gives a day of their own.
DAY_TABLES = ("events", "deliveries", "job_outcomes")
# The look for stored ids and outcomes in an older day's file.
SELECT_STORED_BEFORE = SELECT_STORED.replace(" FROM events ", " FROM before.events ").replace(
    " FROM job_outcomes ", " FROM before.job_outcomes "
)
# The same look in the renamed tables of the same file.
SELECT_STORED_RENAMED = SELECT_STORED.replace(" FROM events ", " FROM before_events ").replace(
    " FROM job_outcomes ", " FROM before_job_outcomes "
)
# What the warmed cache reads first: every B-tree a new event's random ids land in.
WARM = (
    "SELECT count(*) FROM events INDEXED BY sqlite_autoindex_events_1",
    "SELECT count(*) FROM events INDEXED BY events_job",
    "SELECT count(*) FROM deliveries",
    "SELECT count(*) FROM job_outcomes",
)
DELIVERY_HEAD = (
    "INSERT INTO deliveries ({key}, sink, state, attempts, next_attempt_at, last_error, "
    "updated_at) VALUES "
)
DELIVERY_ROW = "(?, ?, 'pending', 0, ?, NULL, ?)"
DELIVERY_ROW_BY_ARRIVAL = "((SELECT rowid FROM events WHERE id = ?), ?, 'pending', 0, ?, NULL, ?)"

Rows = list[tuple[Any, ...]]


def create(path: Path, layout: Layout) -> sqlite3.Connection:
    """A new inbox as the receiver makes one (tests.support.bulk_inbox), changed to ``layout``,
    with SQLite's default page cache again (the receiver's)."""
    conn = new_inbox(path, page_size=layout.page_size, auto_vacuum=layout.auto_vacuum)
    conn.execute("PRAGMA cache_size = -2000")
    for statement in layout.changes:
        conn.execute(statement)
    return conn


def group_rows(token: str, count: int, at: float, state: str) -> tuple[Rows, Rows, Rows]:
    """``count`` events (the benchmarks' ~800-byte bodies with random UUID ids), a delivery
    each to one sink and their job outcomes."""
    events: Rows = []
    deliveries: Rows = []
    outcomes: Rows = []
    for n in range(count):
        body = webhook_body(f"{token}-{n}")
        doc = json.loads(body)
        event_id, job_id = doc["id"], doc["job_id"]
        events.append((event_id, "job.completed", job_id, body, "{}", at, state, None, None))
        deliveries.append((event_id, "files", at, at))
        outcomes.append((f"{job_id} completed", event_id, "webhook", at))
    return events, deliveries, outcomes


def split_tables(conn: sqlite3.Connection) -> None:
    """tables-by-day: the stored events' tables renamed ``before_*`` (their indexes with them),
    and empty ones made beside them as the schema makes them (their indexes named ``day_*``)."""
    names = ", ".join(f"'{table}'" for table in DAY_TABLES)
    made = conn.execute(
        f"SELECT type, name, sql FROM sqlite_master WHERE tbl_name IN ({names}) "
        "AND sql IS NOT NULL ORDER BY type DESC"  # tables first
    ).fetchall()
    for table in DAY_TABLES:
        conn.execute(f"ALTER TABLE {table} RENAME TO before_{table}")
    for kind, name, sql in made:
        conn.execute(sql if kind == "table" else sql.replace(name, f"day_{name}", 1))


def write_group(
    conn: sqlite3.Connection, layout: Layout, rows: tuple[Rows, Rows, Rows], before: bool = False
) -> None:
    """One group as intake writes it; ``before``: its ids looked up in an older day's file (or
    tables) too."""
    events, deliveries, outcomes = rows
    by_arrival = layout.by_arrival
    conn.execute("BEGIN IMMEDIATE")
    ids = json.dumps([e[0] for e in events])
    keys = json.dumps([o[0] for o in outcomes])
    conn.execute(SELECT_STORED, (ids, keys)).fetchall()
    if before:
        lookup = SELECT_STORED_RENAMED if layout.tables_by_day else SELECT_STORED_BEFORE
        conn.execute(lookup, (ids, keys)).fetchall()
    insert(conn, INSERT_OUTCOMES_HEAD, OUTCOME_ROW, outcomes)
    insert(conn, INSERT_EVENTS_HEAD, EVENT_ROW, events)
    key = "event_seq" if by_arrival else "event_id"
    row = DELIVERY_ROW_BY_ARRIVAL if by_arrival else DELIVERY_ROW
    insert(conn, DELIVERY_HEAD.format(key=key), row, deliveries)
    conn.execute("COMMIT")


def fill(conn: sqlite3.Connection, layout: Layout, stored: int) -> None:
    conn.execute("PRAGMA synchronous = OFF")
    at = time.time() - 86_400
    for start in range(0, stored, FILL_CHUNK):
        count = min(FILL_CHUNK, stored - start)
        write_group(conn, layout, group_rows(f"stored{start}", count, at, "done"))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


@dataclass(frozen=True)
class Pass:
    """One pass's figures an event: CPU (µs), of it the checkpoints', WAL frames, wall (µs)."""

    cpu: float
    checkpoint_cpu: float
    frames: float
    wall: float


def measure(
    conn: sqlite3.Connection, layout: Layout, groups: int, every: int, before: bool = False
) -> Pass:
    """``groups`` groups written as intake writes them, a passive checkpoint every ``every``;
    ``before``: an older day's file is attached (``new-file-by-day``)."""
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("PRAGMA temp_store = MEMORY")
    if layout.cache_kib is not None:
        conn.execute(f"PRAGMA cache_size = -{layout.cache_kib}")
        for statement in WARM:
            conn.execute(statement).fetchall()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    token = f"new{time.time_ns()}"
    data = [group_rows(f"{token}-{g}", GROUP, time.time(), "pending") for g in range(groups)]
    frames = 0
    checkpoint_cpu = 0.0
    cpu, wall = time.process_time(), time.perf_counter()
    for g, rows in enumerate(data):
        write_group(conn, layout, rows, before)
        if g % every == every - 1 or g == groups - 1:
            started = time.process_time()
            # (busy, frames in the WAL, frames copied); the next write starts the WAL over.
            frames += conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
            checkpoint_cpu += time.process_time() - started
    events = groups * GROUP
    return Pass(
        cpu=(time.process_time() - cpu) / events * 1e6,
        checkpoint_cpu=checkpoint_cpu / events * 1e6,
        frames=frames / events,
        wall=(time.perf_counter() - wall) / events * 1e6,
    )


def run_layout(name: str, args: argparse.Namespace, work: Path) -> list[object]:
    layout = LAYOUTS[name]
    full = work / f"{name}-stored.db"
    started = time.perf_counter()
    with closing(create(full, layout)) as conn:
        fill(conn, layout, args.stored)
    print(f"  {name}: {args.stored:,} events stored in {time.perf_counter() - started:.0f} s")
    passes: dict[str, list[Pass]] = {"empty": [], "stored": []}
    for _ in range(2):
        for inbox in passes:
            path = work / "measured.db"
            if inbox == "empty":
                conn = create(path, layout)
            elif layout.by_day:
                conn = create(path, layout)
                conn.execute("ATTACH DATABASE ? AS before", (str(full),))
            else:
                for suffix in ("-wal", "-shm"):
                    Path(f"{path}{suffix}").unlink(missing_ok=True)
                shutil.copyfile(full, path)
                conn = sqlite3.connect(path, isolation_level=None)
                conn.execute("PRAGMA journal_mode = WAL")
                if layout.tables_by_day:
                    split_tables(conn)
            before = (layout.by_day or layout.tables_by_day) and inbox == "stored"
            passes[inbox].append(measure(conn, layout, args.groups, args.checkpoint, before))
            conn.close()
    full.unlink()
    empty, stored = (min(passes[inbox], key=lambda p: p.cpu) for inbox in ("empty", "stored"))
    return [
        name,
        f"{empty.cpu:.0f}",
        f"{stored.cpu:.0f}",
        f"+{stored.cpu - empty.cpu:.0f}",
        f"{empty.checkpoint_cpu:.0f} -> {stored.checkpoint_cpu:.0f}",
        f"{empty.frames:.1f} -> {stored.frames:.1f}",
        f"{empty.wall:.0f}",
        f"{stored.wall:.0f}",
        f"{empty.wall / stored.wall:.2f}x",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stored", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=400, help="groups of 32 measured")
    parser.add_argument("--checkpoint", type=int, default=16, help="groups between checkpoints")
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--dir", type=Path, default=None, help="where the files are built")
    args = parser.parse_args(argv)
    layouts = [name for name in args.layouts.split(",") if name]
    if unknown := set(layouts) - set(LAYOUTS):
        parser.error(f"unknown layouts: {', '.join(sorted(unknown))}")
    print(f"bench sqlite layouts: {machine_note('asyncio')}")
    table = Table(
        [
            "layout",
            "CPU µs empty",
            "CPU µs stored",
            "grows by",
            "of it checkpoints",
            "WAL pages an event",
            "wall µs empty",
            "wall µs stored",
            "stored / empty (wall)",
        ]
    )
    with tempfile.TemporaryDirectory(prefix="receiver-layouts-", dir=args.dir) as work:
        for layout in layouts:
            table.add(*run_layout(layout, args, Path(work)))
    print("\n" + table.render())
    print(f"\n  {machine_note('asyncio')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
