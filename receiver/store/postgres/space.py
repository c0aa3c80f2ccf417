"""The Postgres inbox's size on disk (a mixin of :class:`~receiver.store.postgres.PostgresStore`).

Postgres reuses the space of deleted rows itself once autovacuum has passed (the retention loop
deletes in short steps, each its own transaction, which is what lets autovacuum keep up), and
gives it back to the file system only through ``VACUUM FULL``, which the receiver never runs:
there is nothing to reclaim here, only to measure.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from receiver.store.space import InboxSpace

if TYPE_CHECKING:
    from receiver.store.sql.conn import Conn

T = TypeVar("T")

# Every table of the inbox's schema (the first of the search path) with its indexes and TOAST.
TABLES_SIZE = """
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind = 'r'
"""


class PostgresSpace:
    """:meth:`space` and :meth:`reclaim_space` of the Postgres store."""

    if TYPE_CHECKING:

        async def _run_read(
            self, fn: Callable[[Conn], Awaitable[T]], *, snapshot: bool = False
        ) -> T: ...

    async def space(self) -> InboxSpace | None:
        async def run(c: Conn) -> int:
            row = await c.row(TABLES_SIZE)
            return int(row[0]) if row is not None else 0

        return InboxSpace(file_bytes=await self._run_read(run))

    async def reclaim_space(self, *, max_pages: int) -> int:
        return 0
