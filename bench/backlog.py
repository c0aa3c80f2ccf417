"""Inboxes built in bulk for the benchmarks: a million processed events, a backlog to drain.

The schema is the receiver's own (``receiver.store.sqlite.MIGRATIONS``); rows go in with
``synchronous = OFF`` in large transactions, then the WAL is folded into the main file so the
file can be copied.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

from bench.common import ROOT, webhook_body
from receiver.store.sqlite import MIGRATIONS, SCHEMA_VERSION

CHUNK = 20_000
CACHE = ROOT / ".bench" / "cache"


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


def new_inbox(path: Path) -> sqlite3.Connection:
    """A new, empty inbox file at ``path`` with the receiver's schema, opened for bulk writes
    (WAL, ``synchronous = OFF``, a large cache); the caller closes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA cache_size = -262144")
    conn.execute("BEGIN")
    for statements in MIGRATIONS:
        for statement in statements:
            conn.execute(statement)
    conn.execute("COMMIT")
    return conn


def build(
    path: Path,
    count: int,
    *,
    state: str,
    body: Callable[[int], bytes],
    sink: str = "files",
    progress: Callable[[str], None] = print,
) -> Path:
    """An inbox at ``path`` holding ``count`` events in ``state`` (pending or done)."""
    started = time.monotonic()
    with closing(new_inbox(path)) as conn:
        now = time.time() - 3600
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
                        None if done else received,
                    )
                )
                deliveries.append(
                    (
                        data["id"],
                        sink,
                        state,
                        1 if done else 0,
                        None if done else received,
                        received,
                    )
                )
            conn.execute("BEGIN")
            conn.executemany(
                "INSERT INTO events (id, event, job_id, body, headers, received_at, state, "
                "next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                events,
            )
            conn.executemany(
                "INSERT INTO deliveries (event_id, sink, state, attempts, next_attempt_at, "
                "updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                deliveries,
            )
            conn.execute("COMMIT")
            if (start // CHUNK) % 10 == 9:
                progress(f"    {start + CHUNK:,} / {count:,} events written")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
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
    **build_args: object,
) -> Path:
    """A copy at ``target`` of a cached inbox (built once, then reused between runs)."""
    cached = CACHE / name
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
