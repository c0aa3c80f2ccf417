"""The connection the flows written once (:mod:`receiver.store.sql`) run their statements on.

Statements name their parameters (``:event_id``); each backend's adapter passes them as its
driver wants (SQLite takes the names, asyncpg ``$1, $2, ...``) and turns a list value into the
dialect's list parameter (a JSON array for SQLite's ``json_each``, an array for Postgres).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

T = TypeVar("T")

Params = Mapping[str, Any]
NO_PARAMS: Params = {}


class Conn(Protocol):
    """One connection inside the transaction a flow runs in."""

    async def rows(self, sql: str, params: Params = NO_PARAMS) -> Sequence[Sequence[Any]]:
        """Every row the statement returns."""

    async def row(self, sql: str, params: Params = NO_PARAMS) -> Sequence[Any] | None:
        """The first row, or None."""

    async def value(self, sql: str, params: Params = NO_PARAMS) -> Any:
        """The first column of the first row, or None."""

    async def run(self, sql: str, params: Params = NO_PARAMS) -> int:
        """Run a statement; how many rows it changed."""

    async def notify(self) -> None:
        """Wake the other processes sharing the store on commit (where the backend can)."""


class SqlMixin:
    """Base of the flows' mixins: declares, for mypy, what each SQL store defines.

    ``_run_read`` runs ``fn`` in a read (``snapshot``: several statements seeing one moment);
    ``_run_write`` in a write transaction (``transaction=False``: statements that stand alone, which
    a backend with several writers may run without holding one; ``durable=False``: the workers'
    record of their own progress, which a backend may commit without waiting for the disk, since
    losing it to a power cut only means doing that work again).
    """

    if TYPE_CHECKING:

        async def _run_read(
            self, fn: Callable[[Conn], Awaitable[T]], *, snapshot: bool = False
        ) -> T: ...

        async def _run_write(
            self,
            fn: Callable[[Conn], Awaitable[T]],
            *,
            transaction: bool = True,
            durable: bool = True,
        ) -> T: ...
