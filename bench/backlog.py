"""Inboxes built in bulk for the benchmarks: a million processed events, a backlog to drain.

The schema is the receiver's own (``receiver.store.sqlite.MIGRATIONS``), and so are the event
rows' statement and the job-outcome ledger's (filled from the events as the schema's own
migration fills it); rows go in with ``synchronous = OFF`` in large transactions, then the WAL
is folded into the main file so the file can be copied.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from pathlib import Path

from bench.common import ROOT, webhook_body
from receiver.store.sql.pull import BACKFILL_JOB_OUTCOMES
from receiver.store.sqlite import SCHEMA_VERSION
from receiver.store.sqlite.intake import INSERT_EVENT
from tests.support.bulk_inbox import new_inbox as new_inbox  # also for the other benchmarks

CHUNK = 20_000
CACHE = ROOT / ".bench" / "cache"
#: In every cached inbox's name: the layout it was built with (the schema version, and "iv" for
#: incremental vacuum), so an inbox cached by an earlier layout is never reused.
LAYOUT = f"schema{SCHEMA_VERSION}-iv"


def logo_event(n: int) -> bytes:
    """A ``job.completed`` body for the stub upstream: one logo asset, ``ast-job-<n>``."""
    job_id = f"job-{n:08d}"
    return json.dumps(
        {
            "id": f"evt-{n:08d}",
            "object": "event",
            "event": "job.completed",
            "job_id": job_id,
            "type": "logo",
            "asset_ids": {"logo": f"ast-{job_id}"},
        }
    ).encode()


def image_event(n: int) -> bytes:
    return webhook_body(f"stored-{n:08d}")


# (event_id, sink, state, attempts, next_attempt_at, last_error, updated_at)
INSERT_DELIVERY = (
    "INSERT INTO deliveries (event_id, sink, state, attempts, next_attempt_at, last_error,"
    " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def insert_rows(
    conn: sqlite3.Connection,
    events: Sequence[Sequence[object]],
    deliveries: Sequence[Sequence[object]],
) -> None:
    """One transaction of event rows (the receiver's INSERT_EVENT: id, event, job_id, body,
    headers, received_at, state, enrich_at) and delivery rows (INSERT_DELIVERY's columns)."""
    conn.execute("BEGIN")
    conn.executemany(INSERT_EVENT, events)
    conn.executemany(INSERT_DELIVERY, deliveries)
    conn.execute("COMMIT")


def finish_inbox(conn: sqlite3.Connection) -> None:
    """After the bulk rows: each job's outcome recorded, as intake records it, and the WAL folded
    into the main file."""
    conn.execute("BEGIN")
    conn.execute(BACKFILL_JOB_OUTCOMES)
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def build(
    path: Path,
    count: int,
    *,
    state: str,
    body: Callable[[int], bytes],
    sink: str = "files",
    received_hours_ago: float = 1.0,
    progress: Callable[[str], None] = print,
) -> Path:
    """An inbox at ``path`` holding ``count`` events in ``state`` (pending or done), received
    ``received_hours_ago`` (the first; each next one a millisecond later)."""
    started = time.monotonic()
    with closing(new_inbox(path)) as conn:
        now = time.time() - received_hours_ago * 3600
        for start in range(0, count, CHUNK):
            events, deliveries = [], []
            for n in range(start, min(count, start + CHUNK)):
                raw = body(n)
                data = json.loads(raw)
                received = now + n * 1e-3
                done = state == "done"
                events.append(
                    (
                        data["id"],
                        data["event"],
                        data["job_id"],
                        raw,
                        '{"User-Agent":"bench"}',
                        received,
                        state,
                        None if done else received,  # a pending event is due to be enriched
                    )
                )
                deliveries.append(
                    (
                        data["id"],
                        sink,
                        state,
                        1 if done else 0,
                        None if done else received,
                        None,
                        received,
                    )
                )
            insert_rows(conn, events, deliveries)
            if (start // CHUNK) % 10 == 9:
                progress(f"    {start + CHUNK:,} / {count:,} events written")
        finish_inbox(conn)
    progress(
        f"    built {path.name}: {count:,} {state} events in {time.monotonic() - started:.0f} s"
    )
    return path


def count_events(path: Path) -> int:
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA_VERSION:
                return -1
            return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
    except sqlite3.Error:
        return -1


def cached_copy(
    name: str,
    count: int,
    target: Path,
    progress: Callable[[str], None] = print,
    received_hours_ago: float | None = None,
    **build_args: object,
) -> Path:
    """A copy at ``target`` of a cached inbox (built once, then reused between runs).

    ``received_hours_ago``: how old the events are when built (:func:`build`'s default, an
    hour, when None). The cached file's name says it and the :data:`LAYOUT` (``inbox.db`` ->
    ``inbox-200h-ago-schema9-iv.db``), so an inbox of another age or an earlier layout is
    never taken for it."""
    tags = [LAYOUT]
    if received_hours_ago is not None:
        tags.insert(0, f"{received_hours_ago:g}h-ago")
        build_args["received_hours_ago"] = received_hours_ago
    stem, dot, suffix = name.rpartition(".")
    tagged = "-".join([stem if dot else name, *tags]) + (f".{suffix}" if dot else "")
    cached = CACHE / tagged
    if count_events(cached) != count:
        progress(f"  building the cached inbox {cached} (once)")
        build(cached, count, progress=progress, **build_args)  # type: ignore[arg-type]
    shutil.copyfile(cached, target)
    return target


def pending(path: Path) -> int:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as conn:
        return int(
            conn.execute("SELECT count(*) FROM events WHERE state = 'pending'").fetchone()[0]
        )


def iter_states(path: Path) -> Iterator[tuple[str, int]]:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as conn:
        yield from conn.execute("SELECT state, count(*) FROM events GROUP BY state")
