"""A new SQLite inbox with the receiver's schema, opened for bulk rows: how the benchmarks'
inboxes (bench/backlog.py) and the tests that fill an inbox with plain SQL start one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from receiver.store.sqlite import MIGRATIONS
from receiver.store.sqlite.space import PRAGMA_AUTO_VACUUM_INCREMENTAL


def new_inbox(
    path: Path, *, page_size: int | None = None, auto_vacuum: bool = True
) -> sqlite3.Connection:
    """A new, empty inbox file at ``path`` with the receiver's schema, made as the receiver makes
    one (incremental vacuum, said before the first page is written, then WAL), opened for bulk
    writes (``synchronous = OFF``, a large cache); the caller closes it. ``page_size``: other
    than SQLite's default (4096), and ``auto_vacuum=False`` (no incremental vacuum), for
    benchmarks of the layout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    if page_size is not None:
        conn.execute(f"PRAGMA page_size = {int(page_size)}")
    if auto_vacuum:
        conn.execute(PRAGMA_AUTO_VACUUM_INCREMENTAL)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA cache_size = -262144")
    conn.execute("BEGIN")
    for statements in MIGRATIONS:
        for statement in statements:
            conn.execute(statement)
    conn.execute("COMMIT")
    return conn
