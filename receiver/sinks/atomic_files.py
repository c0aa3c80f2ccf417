"""Files written atomically off the event loop: a temporary file, fsync, rename, fsync of the
directory, each step on a worker thread; and the clean-up of temporary files a killed process
left behind. Used by the ``download`` sink (:mod:`receiver.sinks.download`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

T = TypeVar("T")


async def in_thread(func: Callable[..., T], *args: Any) -> T:
    """``asyncio.to_thread``, but a cancelled caller waits for the thread before re-raising.

    So the cleanup that follows a cancellation never closes or unlinks a file a thread is still
    writing.
    """
    future = asyncio.ensure_future(asyncio.to_thread(func, *args))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await future
        raise


def open_temp(temp: Path, opened: list[IO[bytes]]) -> None:
    temp.parent.mkdir(parents=True, exist_ok=True)
    # "x": O_CREAT|O_EXCL, which never follows a symlink planted at that name. The handle goes
    # into ``opened`` rather than being returned so a cancelled caller can still close it.
    opened.append(open(temp, "xb"))  # noqa: SIM115 - closed by commit or discard


def write_batch(handle: IO[bytes], chunks: list[bytes]) -> None:
    for chunk in chunks:
        handle.write(chunk)


def commit(handle: IO[bytes], temp: Path, final: Path) -> None:
    """fsync the file, rename it onto its final name, fsync the directory."""
    try:
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()
        os.replace(temp, final)
    except BaseException:
        discard(handle, temp)
        raise
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def discard(handle: IO[bytes] | None, temp: Path) -> None:
    if handle is not None:
        with contextlib.suppress(OSError):
            handle.close()
    with contextlib.suppress(OSError):
        temp.unlink()


# Older than any download can take: a temporary file this old was left by a killed process
# (another replica writing to a shared directory right now has a younger one).
STALE_TEMP_SECONDS = 6 * 3600.0


def remove_stale_temp_files(root: Path, now: float) -> int:
    """Delete ``.name.tmp-*`` files under ``root`` older than STALE_TEMP_SECONDS."""
    removed = 0
    for temp in root.rglob(".*.tmp-*"):
        with contextlib.suppress(OSError):
            if temp.is_file() and now - temp.stat().st_mtime > STALE_TEMP_SECONDS:
                temp.unlink()
                removed += 1
    return removed
