"""The copies of a SQLite inbox the receiver keeps beside it before it changes the whole file.

Before a ``REINDEX`` (:mod:`.health`) and before a schema migration (:mod:`.migrate`), the
receiver writes the inbox as it is to ``<inbox>.<kind>-<UTC time>`` in the same directory
(``inbox.db.before-migrate-v3-20250102T030405Z``, ``inbox.db.before-reindex-...``), with
SQLite's ``VACUUM INTO``: one consistent snapshot, what the WAL holds included, written through
a connection of its own, so it can be taken while another connection of the process holds the
write lock (the snapshot is then exactly what that lock keeps from changing). The copy is
flushed to disk before the change begins. A copy that cannot be written in full is removed and
the change does not happen.

:func:`prune` keeps the newest copies of one kind and removes the older ones. ``receiver
backup`` writes its copies the same way (:func:`vacuum_into`), into a directory of the user's
choice as ``<inbox name>-<UTC time>.db``, and keeps the newest ones there
(:func:`prune_backups`).
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

VACUUM_INTO = "VACUUM INTO ?"
#: How the UTC time of a copy is written in its name.
STAMP = "%Y%m%dT%H%M%SZ"
# A copy's time in its name, and its number within that second (from 2).
_STAMPED = r"(?P<stamp>\d{8}T\d{6}Z)(?:-(?P<n>\d+))?"


def copy_name(path: Path, kind: str, stamp: str, n: int = 1) -> Path:
    """Where the copy of ``path`` of this ``kind``, taken at ``stamp``, goes."""
    path = path.absolute()  # where to look for it, whatever the working directory
    return path.with_name(f"{path.name}.{kind}-{stamp}" + (f"-{n}" if n > 1 else ""))


def backup_name(directory: Path, name: str, stamp: str, n: int = 1) -> Path:
    """Where ``receiver backup`` puts the copy of the inbox called ``name`` (its file name
    without the suffix), taken at ``stamp``, in ``directory``."""
    return directory / (f"{name}-{stamp}" + (f"-{n}" if n > 1 else "") + ".db")


def stamp_now() -> str:
    """The UTC time now, as copies are named."""
    return datetime.now(UTC).strftime(STAMP)


def first_free(name: Callable[[int], Path]) -> Path:
    """``name(1)``, or ``name(2)``, ... the first that does not exist yet (a second copy within
    the same second; stat only: no descriptor)."""
    n = 1
    while name(n).exists():
        n += 1
    return name(n)


def write_copy(conn: sqlite3.Connection, path: Path, kind: str) -> Path:
    """Write a copy of the inbox at ``path`` beside it through ``conn`` (a connection to it
    with no transaction open); its path. Raises ``sqlite3.Error`` or ``OSError`` when the copy
    cannot be written whole (no space, a directory not writable), leaving no part of it."""
    stamp = stamp_now()
    backup = first_free(lambda n: copy_name(path, kind, stamp, n))
    vacuum_into(conn, backup)
    return backup


def vacuum_into(conn: sqlite3.Connection, target: Path) -> None:
    """Write the database of ``conn`` (no transaction open) to ``target``, a file that does not
    exist yet or is empty, as one consistent snapshot, and flush it to disk. Raises
    ``sqlite3.Error`` or ``OSError`` when it cannot be written whole (no space, a directory not
    writable, interrupted), leaving no part of it."""
    try:
        conn.execute(VACUUM_INTO, (str(target),))
        _sync(target)
    except BaseException:
        with contextlib.suppress(OSError):
            target.unlink()  # a partial copy (another file than the inbox's)
        raise


def _sync(backup: Path) -> None:
    """Flush the copy, and its name in the directory, to disk (a file of its own: closing this
    descriptor touches no lock of the inbox's)."""
    fd = os.open(backup, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    sync_directory(backup.parent)


def sync_directory(directory: Path) -> None:
    """Flush the names in ``directory`` (a rename, a new file) to disk, where the filesystem
    can."""
    with contextlib.suppress(OSError):  # some filesystems cannot sync a directory
        dir_fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def copies(path: Path, kind: str) -> list[Path]:
    """The copies of ``path`` whose kind starts with ``kind`` (``before-migrate`` matches every
    ``before-migrate-vN``), oldest first."""
    path = path.absolute()
    return _oldest_first(path.parent, re.escape(f"{path.name}.{kind}") + r"(?:-v\d+)?-" + _STAMPED)


def backups(directory: Path, name: str) -> list[Path]:
    """The copies ``receiver backup`` wrote in ``directory`` of the inbox called ``name``,
    oldest first (nothing else there is ever counted or removed)."""
    return _oldest_first(directory, re.escape(f"{name}-") + _STAMPED + r"\.db")


def prune(path: Path, kind: str, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` copies of ``path`` of this ``kind``; those removed."""
    return _remove_oldest(copies(path, kind), keep)


def prune_backups(directory: Path, name: str, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` of :func:`backups`; those removed."""
    return _remove_oldest(backups(directory, name), keep)


def _oldest_first(directory: Path, pattern: str) -> list[Path]:
    matcher = re.compile(pattern)
    found = []
    with contextlib.suppress(OSError):
        for entry in directory.iterdir():
            match = matcher.fullmatch(entry.name)
            if match:
                found.append((match["stamp"], int(match["n"] or 1), entry))
    return [entry for _stamp, _n, entry in sorted(found)]


def _remove_oldest(found: list[Path], keep: int) -> list[Path]:
    removed = []
    for old in found[: max(0, len(found) - keep)]:
        with contextlib.suppress(FileNotFoundError):
            old.unlink()
            removed.append(old)
    return removed
