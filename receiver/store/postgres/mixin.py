"""What the Postgres store's mixins (lanes, browse, pull) call on the store they are part of."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

T = TypeVar("T")


class PostgresMixin:
    """Base of the Postgres store's mixins: declares, for mypy, the schema name and the
    statement runner that :class:`~receiver.store.postgres.PostgresStore` defines."""

    if TYPE_CHECKING:
        _schema: str

        async def _run(
            self,
            fn: Callable[[Any], Awaitable[T]],
            *,
            transaction: bool = False,
            snapshot: bool = False,
        ) -> T: ...
