"""The copies of a SQLite inbox the receiver keeps beside it before it changes the whole file.

Before a ``REINDEX`` (:mod:`.health`) and before a schema migration (:mod:`.migrate`), the
receiver writes the inbox as it is to ``<inbox>.<kind>-<UTC time>`` in the same directory
(``inbox.db.before-migrate-v3-20250102T030405Z``, ``inbox.db.before-reindex-...``), with
SQLite's ``VACUUM INTO``: one consistent snapshot, what the WAL holds included, written through
a connection of its own, so it can be taken while another connection of the process holds the
write lock (the snapshot is then exactly what that lock keeps from changing). The copy is
flushed to disk before the change begins. A copy that cannot be written in full is removed and
the change does not happen.

:func:`prune` keeps the newest copies of one kind and removes the older ones.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

VACUUM_INTO = "VACUUM INTO ?"
#: How the UTC time of a copy is written in its name.
STAMP = "%Y%m%dT%H%M%SZ"


def copy_name(path: Path, kind: str, stamp: str, n: int = 1) -> Path:
    """Where the copy of ``path`` of this ``kind``, taken at ``stamp``, goes."""
    path = path.absolute()  # where to look for it, whatever the working directory
    return path.with_name(f"{path.name}.{kind}-{stamp}" + (f"-{n}" if n > 1 else ""))


def write_copy(conn: sqlite3.Connection, path: Path, kind: str) -> Path:
    """Write a copy of the inbox at ``path`` beside it through ``conn`` (a connection to it
    with no transaction open); its path. Raises ``sqlite3.Error`` or ``OSError`` when the copy
    cannot be written whole (no space, a directory not writable), leaving no part of it."""
    stamp = datetime.now(UTC).strftime(STAMP)
    n = 1
    backup = copy_name(path, kind, stamp)
    while backup.exists():  # a second copy within the same second (stat only: no descriptor)
        n += 1
        backup = copy_name(path, kind, stamp, n)
    try:
        conn.execute(VACUUM_INTO, (str(backup),))
        _sync(backup)
    except BaseException:
        with contextlib.suppress(OSError):
            backup.unlink()  # a partial copy (another file than the inbox's)
        raise
    return backup


def _sync(backup: Path) -> None:
    """Flush the copy, and its name in the directory, to disk (a file of its own: closing this
    descriptor touches no lock of the inbox's)."""
    fd = os.open(backup, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):  # some filesystems cannot sync a directory
        dir_fd = os.open(backup.parent, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def copies(path: Path, kind: str) -> list[Path]:
    """The copies of ``path`` whose kind starts with ``kind`` (``before-migrate`` matches every
    ``before-migrate-vN``), oldest first."""
    path = path.absolute()
    pattern = re.compile(
        re.escape(f"{path.name}.{kind}") + r"(?:-v\d+)?-(?P<stamp>\d{8}T\d{6}Z)(?:-(?P<n>\d+))?"
    )
    found = []
    with contextlib.suppress(OSError):
        for entry in path.parent.iterdir():
            match = pattern.fullmatch(entry.name)
            if match:
                found.append((match["stamp"], int(match["n"] or 1), entry))
    return [entry for _stamp, _n, entry in sorted(found)]


def prune(path: Path, kind: str, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` copies of ``path`` of this ``kind``; those removed."""
    found = copies(path, kind)
    removed = []
    for old in found[: max(0, len(found) - keep)]:
        with contextlib.suppress(FileNotFoundError):
            old.unlink()
            removed.append(old)
    return removed
