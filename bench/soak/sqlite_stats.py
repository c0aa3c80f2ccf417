"""What the soak reads of its SQLite inbox at the end: each table's rows and bytes."""

from __future__ import annotations

import contextlib
import sqlite3
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


@dataclass
class InboxTables:
    """Each table's rows and bytes (with its indexes, from ``dbstat``), and the free pages."""

    rows: dict[str, int]
    bytes: Counter[str]
    free_bytes: int


def inbox_tables(path: Path) -> InboxTables:
    """The tables of the inbox file at ``path``, opened read-only (raises sqlite3.Error)."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        owner = dict(
            conn.execute(
                "SELECT name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index')"
            )
        )
        tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        rows = {t: conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
        sizes: Counter[str] = Counter()
        for name, size in conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"):
            sizes[owner.get(name, name)] += int(size)
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        page = conn.execute("PRAGMA page_size").fetchone()[0]
    return InboxTables(rows, sizes, int(free) * int(page))
