"""Turns on one SQLite file's write lock, for the writers of this process and of the others.

SQLite lets one connection write at a time. A connection that finds the lock taken waits in
SQLite's busy handler, which sleeps in growing steps (up to 100 ms) and checks again: with two
receiver processes on one file (``--processes 2``), each commit taking a few milliseconds, a
writer would often sleep long after the lock was free again. :class:`WriterTurns` queues them
instead: an asyncio lock for the writers of this process, and ``flock`` on a small file next to
the database (``<database>-writer``) for the other processes, so a waiting writer is woken the
moment the holder lets go.

It only orders writers; SQLite's own locking still guarantees correctness. When the turn file
cannot be opened, or a turn does not come within ``timeout`` seconds (a stuck process), the
writer goes ahead and SQLite's busy timeout decides, as without turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import threading
from pathlib import Path


class WriterTurns:
    """``async with turns:`` around every write transaction on one database file."""

    def __init__(self, database: Path, timeout: float) -> None:
        self.path = database.with_name(database.name + "-writer")
        self.timeout = timeout
        self._fd: int | None = None
        self._local = asyncio.Lock()
        self._held = False
        self._waiting: asyncio.Future[None] | None = None  # a thread blocked in flock

    def open(self) -> None:
        """Open the turn file (creating it); without it, turns are this process's only."""
        self._local = asyncio.Lock()  # bound to the running loop on first use
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            self._fd = None

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    async def __aenter__(self) -> None:
        await self._local.acquire()
        try:
            self._held = await self._take_file()
        except BaseException:
            self._local.release()
            raise

    async def __aexit__(self, *_exc: object) -> None:
        try:
            if self._held and self._fd is not None:
                self._held = False
                with contextlib.suppress(OSError):
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._local.release()

    async def _take_file(self) -> bool:
        fd = self._fd
        if fd is None:
            return False
        if self._waiting is None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                self._waiting = _flock_in_thread(fd)
            except OSError:
                return False
        try:
            await asyncio.wait_for(asyncio.shield(self._waiting), self.timeout)
        except TimeoutError:
            return False  # the thread keeps waiting; whoever comes next takes its turn
        except OSError:
            self._waiting = None
            return False
        self._waiting = None
        return True


def _flock_in_thread(fd: int) -> asyncio.Future[None]:
    """Block in flock on a daemon thread (never one an event loop's shutdown waits for)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()

    def settle(error: OSError | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    def run() -> None:
        error: OSError | None = None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is gone
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=run, name="sqlite-writer-turn", daemon=True).start()
    return future
