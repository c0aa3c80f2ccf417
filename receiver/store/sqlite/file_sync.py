"""fdatasync of the database file after a background checkpoint, through SQLite's own descriptor.

SQLite syncs the database file only when a checkpoint ends at the WAL's last frame. Under
constant load the background checkpoint never does (commits append while it copies), so the
pages it copies stay unsynced until the writer's own checkpoint between two groups (the one that
lets the WAL restart), whose sync then flushes all of them while every webhook waits for the
writer: about 0.3 s every two seconds on an inbox of a million events. Synced here, off the
commit path, that checkpoint only syncs its last pages.

The sync must never open the file: closing any descriptor of a file drops every POSIX lock the
process holds on it, SQLite's included, and another process closing its last connection would
then take this one for gone and delete the WAL it still writes into (SQLite's "How To Corrupt An
SQLite Database File", 2.2.1; exactly what release 0.1.0 did). So :class:`FileSync` finds the
descriptor one of SQLite's connections holds on the file (Linux's ``/proc/self/fd``) and syncs
through it; it never opens or closes anything of the inbox. Where there is no ``/proc`` the sync
is skipped: it only saves the writer's checkpoint some work, the writer's own sync still happens.
If SQLite closes that descriptor and the number is reused between the look and the sync, another
file is synced: harmless.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

FDS = Path("/proc/self/fd")


class FileSync:
    """``sync()`` forces to disk what checkpoints wrote into ``database`` (best effort)."""

    def __init__(self, database: Path) -> None:
        self._target = str(database.resolve())
        self._fd: int | None = None  # the descriptor found last time, checked before each use

    def sync(self) -> bool:
        """fdatasync the database file through SQLite's descriptor; whether one was found."""
        fd = self._descriptor()
        if fd is None:
            return False
        with contextlib.suppress(OSError):
            os.fdatasync(fd)
        return True

    def _descriptor(self) -> int | None:
        if self._fd is not None and self._points_at_database(self._fd):
            return self._fd
        self._fd = None
        try:
            names = os.listdir(FDS)
        except OSError:
            return None  # no /proc: no sync
        for name in names:
            if name.isdigit() and self._points_at_database(int(name)):
                self._fd = int(name)
                break
        return self._fd

    def _points_at_database(self, fd: int) -> bool:
        try:
            return os.readlink(FDS / str(fd)) == self._target
        except OSError:
            return False
