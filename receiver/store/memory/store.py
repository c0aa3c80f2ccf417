"""An in-memory inbox with the same semantics as the SQL stores, for unit tests: its parts are
named as their twins in the other backends (:mod:`.intake`, :mod:`.lanes`, :mod:`.browse`,
:mod:`.pull`, on the rows of :mod:`.records`)."""

from __future__ import annotations

from collections.abc import Callable

from receiver.config.settings import StoreSettings
from receiver.store.memory.browse import MemoryBrowse
from receiver.store.memory.intake import MemoryIntake
from receiver.store.memory.lanes import MemoryLanes


class MemoryStore(MemoryIntake, MemoryLanes, MemoryBrowse):
    """An inbox kept in a dict: the fake for unit tests, with the SQL stores' semantics.

    It works without :meth:`open` (forgiving for tests) but refuses calls after :meth:`close`
    until opened again; the data survives close/open within the process. Set
    :attr:`unavailable` to a message to make every call raise StoreUnavailable (to test 503s).
    """

    def __init__(self, settings: StoreSettings | None = None) -> None:
        super().__init__()
        self.settings = settings or StoreSettings(url="memory://")

    async def open(self) -> None:
        self._closed = False

    async def close(self) -> None:
        self._closed = True

    async def ping(self) -> None:
        self._check()

    def on_new_events(self, callback: Callable[[], None]) -> None:
        """Nothing to do: every writer shares this process."""
