"""The SQLite connection as the flows of :mod:`receiver.store.sql` see it: named parameters as
SQLite takes them, a list as one JSON array (read with ``json_each``).

A flow runs whole on the connection's own thread (:func:`run_flow`), in one hand-off from the
event loop: each of its statements executes at once, so a write transaction holds SQLite's one
write lock for the time its statements take, not for a trip through a busy event loop and back
per statement (a settle is about eight statements; under load each trip waits a whole turn of
the loop, while intake's next group waits for the lock).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aiosqlite

from receiver.store.sql.conn import NO_PARAMS, Conn, Params

T = TypeVar("T")


def _params(params: Params) -> dict[str, Any]:
    # Lists of ids travel as one JSON array parameter, so every statement stays a fixed string.
    return {k: json.dumps(v) if isinstance(v, list) else v for k, v in params.items()}


class SqliteConn:
    """One SQLite connection inside the store's transaction, used on its own thread: the
    methods are coroutines only to match :class:`~receiver.store.sql.conn.Conn`; none ever
    suspends."""

    __slots__ = ("_conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    async def rows(self, sql: str, params: Params = NO_PARAMS) -> Sequence[Sequence[Any]]:
        return self._conn.execute(sql, _params(params)).fetchall()

    async def row(self, sql: str, params: Params = NO_PARAMS) -> Sequence[Any] | None:
        rows = await self.rows(sql, params)
        return rows[0] if rows else None

    async def value(self, sql: str, params: Params = NO_PARAMS) -> Any:
        row = await self.row(sql, params)
        return None if row is None else row[0]

    async def run(self, sql: str, params: Params = NO_PARAMS) -> int:
        return int(self._conn.execute(sql, _params(params)).rowcount)

    async def notify(self) -> None:
        """Nothing to do: SQLite cannot tell other processes about this one's writes."""


def _to_end(fn: Callable[[Conn], Awaitable[T]], conn: sqlite3.Connection) -> T:
    """Run the flow ``fn`` to its end on this thread (the connection's)."""
    coro = fn(SqliteConn(conn))
    try:
        coro.send(None)  # type: ignore[attr-defined]
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()  # type: ignore[attr-defined]
    raise RuntimeError("a store flow awaited something other than its SQLite statements")


async def run_flow(conn: aiosqlite.Connection, fn: Callable[[Conn], Awaitable[T]]) -> T:
    """Run the flow ``fn`` on ``conn``'s thread, in one hand-off (``_execute`` is aiosqlite's
    own way to run a function there, what its public methods are built on)."""
    result: T = await conn._execute(_to_end, fn, conn._conn)  # type: ignore[no-untyped-call]
    return result
