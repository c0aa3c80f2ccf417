"""The Postgres connection as the flows of :mod:`receiver.store.sql` see it: ``:name``
parameters numbered ``$1, $2, ...`` for asyncpg (once per statement text), a list as an array."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

from receiver.store.sql.conn import NO_PARAMS, Params

_NAMED = re.compile(r"(?<!:):([a-z_]+)")


@functools.cache
def numbered(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with its ``:name`` parameters as ``$1, $2, ...`` (a ``::type`` cast is left
    alone), and the names in that order."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in order:
            order.append(name)
        return f"${order.index(name) + 1}"

    return _NAMED.sub(number, sql), tuple(order)


def command_count(status: str) -> int:
    """The row count of a command status such as ``UPDATE 3``."""
    tail = status.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0


#: Every receiver in a database wakes on this channel; the payload names the schema that changed.
CHANNEL = "receiver_new_events"
NOTIFY = "SELECT pg_notify($1, $2)"


class PostgresConn:
    """One asyncpg connection (in the store's transaction, if any); ``schema`` is what a
    notification names."""

    __slots__ = ("_conn", "_schema")

    def __init__(self, conn: Any, schema: str) -> None:
        self._conn = conn
        self._schema = schema

    async def rows(self, sql: str, params: Params = NO_PARAMS) -> Sequence[Sequence[Any]]:
        text, names = numbered(sql)
        rows: Sequence[Sequence[Any]] = await self._conn.fetch(text, *[params[n] for n in names])
        return rows

    async def row(self, sql: str, params: Params = NO_PARAMS) -> Sequence[Any] | None:
        text, names = numbered(sql)
        row: Sequence[Any] | None = await self._conn.fetchrow(text, *[params[n] for n in names])
        return row

    async def value(self, sql: str, params: Params = NO_PARAMS) -> Any:
        text, names = numbered(sql)
        return await self._conn.fetchval(text, *[params[n] for n in names])

    async def run(self, sql: str, params: Params = NO_PARAMS) -> int:
        text, names = numbered(sql)
        return command_count(await self._conn.execute(text, *[params[n] for n in names]))

    async def notify(self) -> None:
        """``NOTIFY receiver_new_events`` (sent by Postgres on commit)."""
        await self._conn.execute(NOTIFY, CHANNEL, self._schema)
