"""What a copy asks of each store, whichever backend it is (:class:`Side`), and the keyset query
both backends page through a table with."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from receiver.store.copy.locations import Location
from receiver.store.copy.tables import Column, Table, quoted

#: A primary key's values, in key order.
Key = tuple[Any, ...]


class Side(Protocol):
    """One open store of a copy: the source (read in one snapshot) or the target."""

    location: Location

    async def version(self) -> int:
        """The inbox's schema version (0: no inbox schema yet)."""

    async def tables(self) -> dict[str, Table]:
        """The inbox's tables, read from its schema."""

    async def snapshot(self) -> None:
        """From now until :meth:`close`, every read sees the store as it was at this moment."""

    async def count(self, table: str) -> int:
        """How many rows ``table`` holds."""

    async def first_rows(self, tables: Sequence[str]) -> str | None:
        """The first of ``tables`` that holds a row, or None when all are empty."""

    async def page(
        self,
        table: str,
        columns: Sequence[Column],
        key: Sequence[str],
        after: Key | None,
        limit: int,
    ) -> list[Sequence[Any]]:
        """Up to ``limit`` rows of ``table`` (``columns``, in that order), in key order, those
        whose key is above ``after`` (all when None)."""

    async def write(
        self,
        table: Table,
        columns: Sequence[Column],
        values: Sequence[Sequence[Any]],
        *,
        skip_existing: bool,
    ) -> int:
        """Insert rows, given column by column (``values[i]`` holds ``columns[i]``'s), in one
        transaction; how many were inserted. ``skip_existing``: a row whose key is already
        there is skipped (else it fails the batch)."""

    async def finish(self, tables: Sequence[Table]) -> None:
        """After the last write: what the store needs to go on from the copied rows."""

    async def close(self) -> None:
        """Let go of the store (ending the snapshot)."""


def page_query(
    table: str,
    columns: Sequence[Column],
    key: Sequence[str],
    *,
    after: bool,
    mark: Callable[[int], str],
) -> str:
    """``SELECT columns FROM table [WHERE (key) > (...)] ORDER BY key LIMIT ...``: keyset
    paging, never OFFSET, so each page is an index range however far into the table it is.
    ``mark(n)`` is the n-th parameter's placeholder (1-based); the limit comes last."""
    keys = ", ".join(quoted(name) for name in key)
    where = ""
    if after:
        marks = ", ".join(mark(n + 1) for n in range(len(key)))
        where = f" WHERE ({keys}) > ({marks})" if len(key) > 1 else f" WHERE {keys} > {marks}"
    selected = ", ".join(column.ref for column in columns)
    limit = mark(len(key) + 1 if after else 1)
    return f"SELECT {selected} FROM {quoted(table)}{where} ORDER BY {keys} LIMIT {limit}"


class TableReads:
    """The reads both backends answer with the same SQL, through their ``_select`` (a mixin)."""

    if TYPE_CHECKING:

        async def _select(self, sql: str) -> list[Sequence[Any]]: ...

    async def count(self, table: str) -> int:
        """How many rows ``table`` holds."""
        ((count,),) = await self._select(f"SELECT count(*) FROM {quoted(table)}")
        return int(count)

    async def first_rows(self, tables: Sequence[str]) -> str | None:
        """The first of ``tables`` that holds a row, or None when all are empty."""
        for table in tables:
            if await self._select(f"SELECT 1 FROM {quoted(table)} LIMIT 1"):
                return table
        return None
