"""Comparing one table's keys on the source (in its snapshot) and on the target.

Both stores are read in key order, a page at a time (never a whole table in memory), and merged:
a key only the source has is *missing* from the target, a key only the target has is *extra*.
Each side's keys are also hashed in that order (sha256 over each key's text and a newline), so
two inboxes can be compared by their digests alone. Both backends order keys alike: SQLite's
``BINARY`` collation and Postgres's ``"C"`` (the inbox's key columns) compare bytes, and text
ids are UTF-8, whose byte order is the order Python compares them in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from receiver.store.copy.side import Key, Side
from receiver.store.copy.tables import Column, Table


@dataclass
class KeyCheck:
    """What comparing one table's keys found."""

    source_rows: int = 0
    target_rows: int = 0
    missing: int = 0
    extra: int = 0
    source_digest: str = ""
    target_digest: str = ""

    @property
    def matches(self) -> bool:
        return self.missing == 0 and self.extra == 0


class KeyStream:
    """One side's keys of a table, in key order, a page at a time, hashed as they pass."""

    def __init__(self, side: Side, table: Table, batch: int) -> None:
        self.side = side
        self.table = table
        self.columns: list[Column] = [_key_column(table, name) for name in table.key]
        self.batch = batch
        self.page: list[Key] = []
        self.done = False
        self.rows = 0
        self.hash = hashlib.sha256()

    async def rest(self) -> list[Key]:
        """The keys not yet taken (a new page when those of the last are all taken)."""
        if not self.page and not self.done:
            after = self._last if self.rows else None
            rows = await self.side.page(
                self.table.name, self.columns, self.table.key, after, self.batch
            )
            self.page = [tuple(row) for row in rows]
            self.done = len(rows) < self.batch
        return self.page

    def take(self, count: int) -> None:
        """Mark the first ``count`` keys of the page as compared."""
        taken, self.page = self.page[:count], self.page[count:]
        if taken:
            self._last = taken[-1]
            self.rows += len(taken)
            self.hash.update("".join(f"{key!r}\n" for key in taken).encode())

    _last: Key = ()


def _key_column(table: Table, name: str) -> Column:
    column = table.column(name)
    assert column is not None, f"{table.name} has no key column {name}"
    return column


async def compare_keys(
    source: Side,
    source_table: Table,
    target: Side,
    target_table: Table,
    *,
    batch: int,
    progress: Callable[[int], None] | None = None,
) -> KeyCheck:
    """Merge the source's and the target's keys of one table; ``progress`` is told how many of
    the source's keys were compared, after each page."""
    ours, theirs = KeyStream(source, source_table, batch), KeyStream(target, target_table, batch)
    check = KeyCheck()
    while True:
        a, b = await ours.rest(), await theirs.rest()
        if not a and not b:
            break
        i, j = _merge(a, b, check)
        ours.take(i)
        theirs.take(j)
        if progress is not None:
            progress(ours.rows)
    check.source_rows, check.target_rows = ours.rows, theirs.rows
    check.source_digest, check.target_digest = ours.hash.hexdigest(), theirs.hash.hexdigest()
    return check


def _merge(a: Sequence[Any], b: Sequence[Any], check: KeyCheck) -> tuple[int, int]:
    """Walk two sorted pages while both have keys (or the rest of one when the other side has
    none left); count what one has and the other lacks; how far each got."""
    if not b:
        check.missing += len(a)
        return len(a), 0
    if not a:
        check.extra += len(b)
        return 0, len(b)
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            i += 1
            j += 1
        elif a[i] < b[j]:
            check.missing += 1
            i += 1
        else:
            check.extra += 1
            j += 1
    return i, j
