"""The SQLite connection as the flows of :mod:`receiver.store.sql` see it: named parameters as
SQLite takes them, a list as one JSON array (read with ``json_each``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import aiosqlite

from receiver.store.sql.conn import NO_PARAMS, Params


def _params(params: Params) -> dict[str, Any]:
    # Lists of ids travel as one JSON array parameter, so every statement stays a fixed string.
    return {k: json.dumps(v) if isinstance(v, list) else v for k, v in params.items()}


class SqliteConn:
    """One aiosqlite connection, inside the store's transaction."""

    __slots__ = ("_conn",)

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn

    async def rows(self, sql: str, params: Params = NO_PARAMS) -> Sequence[Sequence[Any]]:
        return list(await self._conn.execute_fetchall(sql, _params(params)))

    async def row(self, sql: str, params: Params = NO_PARAMS) -> Sequence[Any] | None:
        rows = await self.rows(sql, params)
        return rows[0] if rows else None

    async def value(self, sql: str, params: Params = NO_PARAMS) -> Any:
        row = await self.row(sql, params)
        return None if row is None else row[0]

    async def run(self, sql: str, params: Params = NO_PARAMS) -> int:
        return int((await self._conn.execute(sql, _params(params))).rowcount)

    async def notify(self) -> None:
        """Nothing to do: SQLite cannot tell other processes about this one's writes."""
