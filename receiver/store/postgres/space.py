"""The Postgres inbox's size on disk (a mixin of :class:`~receiver.store.postgres.PostgresStore`).

Postgres reuses the space of deleted rows itself once autovacuum has passed (the retention loop
deletes in short steps, each its own transaction, which is what lets autovacuum keep up), and
gives it back to the file system only through ``VACUUM FULL``, which the receiver never runs.
On a server with autovacuum off, nothing would ever reuse it: there the retention cycle runs a
plain ``VACUUM`` of the tables it prunes (:meth:`PostgresSpace.reclaim_space`), which takes no
lock that blocks reads or writes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import asyncpg

from receiver.errors import StoreUnavailable
from receiver.store.space import InboxSpace

if TYPE_CHECKING:
    from receiver.store.sql.conn import Conn

T = TypeVar("T")

# Every table of the inbox's schema (the first of the search path) with its indexes and TOAST,
# their indexes alone, whether the server's autovacuum runs, and its shared buffers.
TABLES_SIZE = """
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0), coalesce(sum(pg_indexes_size(c.oid)), 0),
       current_setting('autovacuum'), pg_size_bytes(current_setting('shared_buffers'))
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind = 'r'
"""
# The tables retention deletes from.
VACUUM = "VACUUM (ANALYZE) events, deliveries, event_steps, job_outcomes, asset_ledger"
#: A VACUUM of a large inbox takes minutes (it never blocks reads or writes meanwhile).
VACUUM_TIMEOUT_SECONDS = 3600.0


class PostgresSpace:
    """:meth:`space` and :meth:`reclaim_space` of the Postgres store."""

    if TYPE_CHECKING:
        _pool: Any
        _timeout: float

        async def _run_read(
            self, fn: Callable[[Conn], Awaitable[T]], *, snapshot: bool = False
        ) -> T: ...

    async def space(self) -> InboxSpace | None:
        async def run(c: Conn) -> InboxSpace:
            row = await c.row(TABLES_SIZE)
            assert row is not None
            return InboxSpace(
                file_bytes=int(row[0]),
                reclaimable=row[2] == "off",
                index_bytes=int(row[1]),
                cache_bytes=int(row[3]),
            )

        return await self._run_read(run)

    async def reclaim_space(self, *, max_pages: int) -> int:
        """With the server's autovacuum off, a plain VACUUM of the pruned tables (all of it at
        once, ``max_pages`` aside); 0: the bytes it makes reusable are not known."""
        if self._pool is None:
            raise StoreUnavailable("the inbox is not open")
        try:
            async with self._pool.acquire(timeout=self._timeout) as conn:
                await conn.execute(VACUUM, timeout=VACUUM_TIMEOUT_SECONDS)
        except (asyncpg.PostgresError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"VACUUM of the inbox's tables failed: {exc}") from exc
        return 0
