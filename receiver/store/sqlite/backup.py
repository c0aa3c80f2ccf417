"""``receiver backup`` of a SQLite inbox: a consistent copy, checked, taken while the receiver
serves.

The copy is one ``VACUUM INTO`` (:mod:`.backup_copy`) from a connection of its own: a read
snapshot of the inbox, what the WAL holds included, so every event answered 2xx before the
backup began is in it. It never waits for writers, and they never wait for it: intake and
delivery go on meanwhile (SQLite's online backup API, by contrast, starts again whenever another
process writes, and may never end under load). The copy is written to ``<DEST>.partial``, then
checked (``PRAGMA integrity_check``, this release's schema version, the events table read),
flushed to disk and renamed to ``DEST``. A copy that cannot be written or checked whole is
removed; the inbox is only read.

``DEST`` may be a directory: the copy is then ``<dir>/<inbox name>-<UTC time>.db``, and the
newest ``keep`` such copies there are kept (:func:`~.backup_copy.prune_backups`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from receiver.errors import StoreError
from receiver.store.sqlite.backup_copy import (
    backup_name,
    first_free,
    prune_backups,
    stamp_now,
    sync_directory,
    vacuum_into,
)
from receiver.store.sqlite.faults import _unavailable
from receiver.store.sqlite.migrate import named, newer, read_version
from receiver.store.sqlite.schema import PRAGMA_USER_VERSION, SCHEMA_VERSION

#: How long opening the inbox waits for another process's lock.
BUSY_SECONDS = 5.0
#: How often the copy's progress is reported, at most.
PROGRESS_SECONDS = 1.0
PARTIAL = ".partial"
COUNT_EVENTS = "SELECT count(*) FROM events"

#: Called with the bytes written so far and about how many there will be in all.
Progress = Callable[[int, int], None]


class BackupFailed(StoreError):
    """The backup was not taken."""


@dataclass(frozen=True)
class Backup:
    """A copy taken: where, its size in bytes, its events, its schema version, how long it
    took, and the older copies removed from its directory (``--keep``)."""

    path: Path
    size: int
    events: int
    version: int
    seconds: float
    removed: tuple[Path, ...] = ()


def back_up(
    inbox: Path, dest: Path, *, keep: int | None = None, progress: Progress | None = None
) -> Backup:
    """Copy the inbox at ``inbox`` to ``dest`` (a new file, or a directory); see the module.

    Raises :class:`BackupFailed` (nothing kept), :class:`~receiver.errors.StoreNewer` for an
    inbox a newer release wrote, :class:`~receiver.errors.StoreUnavailable` for one SQLite
    cannot read."""
    started = time.monotonic()
    inbox, dest = inbox.absolute(), dest.absolute()
    _check_source(inbox)
    target, directory = _target(inbox, dest)
    partial = target.with_name(target.name + PARTIAL)
    what = f"the backup of {inbox} to {target}"
    _create_empty(partial, target)
    try:
        conn, total = _open(inbox)
        try:
            _copy(conn, partial, total, progress, what=what)
        finally:
            conn.close()
        events = _check_copy(partial, what)
        try:
            os.rename(partial, target)
        except OSError as exc:
            raise BackupFailed(f"{what} failed: {_reason(exc)}; nothing was kept") from exc
        sync_directory(target.parent)
    except BaseException:
        _remove(partial)
        raise
    removed = prune_backups(target.parent, inbox.stem, keep) if directory and keep else []
    return Backup(
        target,
        target.stat().st_size,
        events,
        SCHEMA_VERSION,
        time.monotonic() - started,
        tuple(removed),
    )


def _check_source(inbox: Path) -> None:
    """Refuse an inbox that is not there, or not at this release's schema version (a backup
    never migrates)."""
    try:
        version = read_version(inbox, BUSY_SECONDS)
    except sqlite3.Error as exc:
        raise _unavailable(exc, inbox) from exc
    if version is None:
        raise BackupFailed(f"there is no inbox at {inbox}: nothing to back up")
    if version > SCHEMA_VERSION:
        raise newer(inbox, version)
    if version < SCHEMA_VERSION:
        raise BackupFailed(
            f"{named(inbox)} has schema version {version}, older than this release's "
            f"{SCHEMA_VERSION}: run `receiver migrate` first (a backup never migrates); "
            "nothing was written"
        )


def _target(inbox: Path, dest: Path) -> tuple[Path, bool]:
    """Where the copy goes, and whether ``dest`` is a directory (then the copy gets a name of
    its own there). A file that exists is never replaced."""
    if dest.is_dir():
        stamp = stamp_now()
        return first_free(lambda n: backup_name(dest, inbox.stem, stamp, n)), True
    if dest.exists() or dest.is_symlink():
        raise BackupFailed(
            f"{dest} already exists: name a new file, or a directory to put the copy in; "
            "nothing was written"
        )
    if not dest.parent.is_dir():
        what = "is not a directory" if dest.parent.exists() else "does not exist"
        raise BackupFailed(f"cannot write {dest}: {dest.parent} {what}; nothing was written")
    return dest, False


def _create_empty(partial: Path, target: Path) -> None:
    """Create ``partial``, empty, for ``VACUUM INTO`` to fill (a file that exists already is
    another backup's, running or stopped part way)."""
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise BackupFailed(
            f"{partial} already exists: another backup to {target} is running, or one was "
            "stopped part way (then remove it); nothing was written"
        ) from None
    except OSError as exc:
        raise BackupFailed(
            f"cannot write {partial}: {exc.strerror or exc}; nothing was written"
        ) from None
    os.close(fd)


def _open(inbox: Path) -> tuple[sqlite3.Connection, int]:
    """A connection of the backup's own to the inbox (read-write, as every other process's:
    the last one to close a WAL file removes its -wal and -shm), and about how many bytes the
    copy will take: the inbox's pages (its free pages are left out of the copy)."""
    try:
        conn = sqlite3.connect(
            inbox, timeout=BUSY_SECONDS, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise _unavailable(exc, inbox) from exc
    try:
        ((pages,),) = conn.execute("PRAGMA page_count").fetchall()
        ((page_size,),) = conn.execute("PRAGMA page_size").fetchall()
    except sqlite3.Error as exc:
        conn.close()
        raise _unavailable(exc, inbox) from exc
    return conn, int(pages) * int(page_size)


def _copy(
    conn: sqlite3.Connection, partial: Path, total: int, progress: Progress | None, *, what: str
) -> None:
    """``VACUUM INTO partial`` on a thread of its own, while this one reports the progress at
    most every :data:`PROGRESS_SECONDS` and stays free for Ctrl-C, which interrupts the copy
    (the partial file is removed)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            vacuum_into(conn, partial)
        except BaseException as exc:  # handed to the main thread
            failure.append(exc)

    worker = threading.Thread(target=run, name="backup-copy", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(PROGRESS_SECONDS)
            if worker.is_alive() and progress is not None:
                progress(_bytes_in(partial), total)
    except BaseException:
        conn.interrupt()
        worker.join()
        _remove(partial)
        raise
    if failure:
        exc = failure[0]
        if isinstance(exc, sqlite3.Error | OSError):
            raise BackupFailed(
                f"{what} failed: {_reason(exc)}; the partial copy was removed, the inbox is as "
                "it was"
            ) from exc
        raise exc


def _check_copy(partial: Path, what: str) -> int:
    """Check the copy as SQLite reads it; how many events it holds."""
    uri = f"file:{quote(str(partial))}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        try:
            problems = [str(row) for (row,) in conn.execute("PRAGMA integrity_check")]
            ((version,),) = conn.execute(PRAGMA_USER_VERSION).fetchall()
            ((events,),) = conn.execute(COUNT_EVENTS).fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise BackupFailed(
            f"{what} failed: the copy could not be read back ({_reason(exc)}); it was removed"
        ) from exc
    if problems != ["ok"]:
        raise BackupFailed(
            f"{what} failed: the copy does not pass SQLite's integrity check "
            f"({'; '.join(problems[:2])}), so neither may the inbox: see "
            "docs/operations.md#a-damaged-sqlite-inbox; the copy was removed"
        )
    if version != SCHEMA_VERSION:
        raise BackupFailed(
            f"{what} failed: the copy has schema version {version}, not {SCHEMA_VERSION} "
            "(was the inbox migrated meanwhile?); it was removed"
        )
    return int(events)


def _bytes_in(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _reason(exc: BaseException) -> str:
    """What went wrong, in the words of the system or SQLite."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    name = str(getattr(exc, "sqlite_errorname", ""))
    if name == "SQLITE_INTERRUPT":
        return "interrupted"
    if name.startswith("SQLITE_IOERR") or name == "SQLITE_FULL":
        return f"{exc} (is the disk full, or the file larger than this process may write?)"
    return str(exc)
