"""Group commit: writes submitted concurrently in one event loop are written together.

Each webhook must be committed before it is answered, and a commit (an fsync, a round trip) costs
far more than one more row in it. :class:`GroupCommit` queues what callers submit and hands
everything waiting to one ``write`` call: one statement, one transaction, one commit for the
whole group; each caller is answered once that commit returned. While a group is being written
the next one gathers, so the group size follows the load by itself: one item when idle (no
added delay), hundreds under load.

The SQLite and Postgres stores both use it for :meth:`~receiver.store.base.Store.add_event`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")

#: ``write(items)`` answers each item in order: its result, or the exception for that item alone.
#: Raising fails every item of the group with that exception.
Write = Callable[[list[ItemT]], Awaitable[Sequence["ResultT | BaseException"]]]


class GroupCommit(Generic[ItemT, ResultT]):
    """Gathers concurrent :meth:`submit` calls into groups of at most ``max_batch`` items.

    At most ``max_in_flight`` groups are written at once (1 for a single SQLite writer; more
    lets a server-side database overlap one group's commit with the next group's statement).
    :attr:`groups` counts the groups written successfully.
    """

    def __init__(
        self, write: Write[ItemT, ResultT], *, max_batch: int, max_in_flight: int = 1
    ) -> None:
        self._write = write
        self.max_batch = max(1, max_batch)
        self.max_in_flight = max(1, max_in_flight)
        self.groups = 0
        self._pending: list[tuple[ItemT, asyncio.Future[ResultT]]] = []
        self._flushers: set[asyncio.Task[None]] = set()
        self._writing = 0  # flushers started and not finished (counted by the flushers)

    def submit(self, item: ItemT) -> asyncio.Future[ResultT]:
        """Queue ``item``; the future resolves once the group holding it is committed."""
        future: asyncio.Future[ResultT] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._writing < self.max_in_flight:
            # Starts on the next loop iteration: whatever else is submitted meanwhile joins.
            self._writing += 1
            task = asyncio.get_running_loop().create_task(self._flush())
            self._flushers.add(task)
            task.add_done_callback(self._flushers.discard)
        return future

    @property
    def busy(self) -> bool:
        """Whether anything is queued or being written."""
        return bool(self._pending or self._flushers)

    async def drain(self) -> None:
        """Wait until everything submitted so far is written and answered."""
        while self._flushers:
            await asyncio.gather(*self._flushers, return_exceptions=True)

    async def _flush(self) -> None:
        try:
            await self._flush_pending()
        finally:
            # In the same step as the last look at _pending: a submit() after it starts a new
            # flusher (the task's done callbacks would run one step too late for that).
            self._writing -= 1

    async def _flush_pending(self) -> None:
        while self._pending:
            group = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            try:
                results = await self._write([item for item, _future in group])
            except BaseException as exc:
                for _item, future in group:
                    if not future.done():
                        future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise  # cancelled (the loop is closing): stop, nobody waits for more
                continue
            self.groups += 1
            for (_item, future), result in zip(group, results, strict=True):
                if future.done():  # the caller was cancelled
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)
