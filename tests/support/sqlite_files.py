"""How a process holds a SQLite inbox's files, read from Linux's /proc.

A process serving a SQLite inbox in WAL mode holds a read lock on the database file for as long
as its connections are open; that lock is how another process closing its own last connection
knows it is not the last one (the last one deletes the WAL). A process that lost its locks (by
closing any descriptor of the file it opened itself) goes on writing into a WAL another process
may delete: its later commits are then gone. These checks see both from outside.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def deleted_inbox_files(pid: int | str, db: Path) -> list[str]:
    """The descriptors of process ``pid`` (or ``"self"``) that point at a deleted file of the
    inbox ``db`` (the database, its ``-wal`` or ``-shm``)."""
    targets = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            targets.append(os.readlink(fd))
    prefix = str(db.resolve())
    return [t for t in targets if t.startswith(prefix) and t.endswith("(deleted)")]


def locks_on(pid: int, path: Path) -> list[str]:
    """The POSIX locks process ``pid`` holds on ``path`` (lines of /proc/locks, without their
    ordinal, which changes as other locks come and go)."""
    inode = path.stat().st_ino
    held = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        mine = len(fields) >= 6 and fields[1] == "POSIX" and fields[4] == str(pid)
        if mine and fields[5].rsplit(":", 1)[-1] == str(inode):
            held.append(" ".join(fields[1:]))
    return held
