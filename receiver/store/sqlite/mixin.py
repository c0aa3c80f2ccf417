"""What the SQLite store's mixins (lanes, browse, pull) call on the store they are part of."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import aiosqlite

T = TypeVar("T")


class SqliteMixin:
    """Base of the SQLite store's mixins: declares, for mypy, the transaction helpers that
    :class:`~receiver.store.sqlite.SqliteStore` defines."""

    if TYPE_CHECKING:

        async def _write_tx(self, fn: Callable[[aiosqlite.Connection], Awaitable[T]]) -> T: ...

        async def _read_tx(self, fn: Callable[[aiosqlite.Connection], Awaitable[T]]) -> T: ...
