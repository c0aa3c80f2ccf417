"""``receiver restore``: put a copy of a SQLite inbox (a ``receiver backup``) in the inbox's
place, while no process uses the inbox.

The steps, each reported as one line:

1. **The copy is checked** before anything else: a SQLite database whose ``PRAGMA
   integrity_check`` says ``ok``, with an events table, at a schema version this release knows
   (an older one is migrated at the next start, or by ``receiver migrate``, with a copy of its
   own kept first). It is opened read-only and never written; a ``-wal`` file beside it is read
   with it.
2. **The inbox is claimed** (:func:`claimed`): a connection switches it out of WAL mode
   (``PRAGMA journal_mode=DELETE``), which SQLite allows only to a connection that has the
   file to itself, and which fails with "database is locked" while any other process has it
   open (a receiver holds its connections open as long as it runs). Leaving WAL mode writes
   the WAL back into the file and removes the ``-wal`` and ``-shm`` files. An inbox in use is
   refused here, before the copy is written.
3. **The copy is written beside the inbox** (``VACUUM INTO`` a temporary file, flushed to disk
   and read back), and its leases are cleared: they name processes of the receivers that ran
   when the copy was taken, and the work they held would wait for them to expire.
4. **The inbox is claimed again, and held**: after the switch, the same connection locks the
   file (``locking_mode=EXCLUSIVE``) until the swap is done, so no receiver can start on it in
   between. **The inbox is moved aside** to ``<inbox>.before-restore-<UTC time>`` (never
   removed: delete it when it is no longer needed), with any ``-wal``, ``-shm`` or
   ``-journal`` file left beside it, and **the copy is renamed into place**.

Everything here opens the inbox only through SQLite, never through a descriptor of its own
(closing one would drop the lock SQLite holds: see :mod:`.health`); files are only renamed.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from receiver.errors import StoreError, StoreNewer
from receiver.store.sqlite.backup_copy import (
    copy_name,
    first_free,
    stamp_now,
    sync_directory,
    vacuum_into,
)
from receiver.store.sqlite.faults import _is_busy
from receiver.store.sqlite.schema import PRAGMA_USER_VERSION, SCHEMA_VERSION

#: How long the claim waits for another process to let go of the inbox (a command that reads
#: it for a moment), before it counts as in use.
CLAIM_SECONDS = 2.0
#: What SQLite keeps beside a database file, by suffix.
SIDE_FILES = ("-wal", "-shm", "-journal")
ASIDE_KIND = "before-restore"


#: The tables whose rows carry a lease (deliveries, events, watches), read from the copy.
LEASED_TABLES = (
    "SELECT m.name FROM sqlite_schema AS m JOIN pragma_table_info(m.name) AS c "
    "WHERE m.type = 'table' AND c.name = 'lease_owner'"
)
CLEAR_LEASES = (
    'UPDATE "{table}" SET lease_owner = NULL, lease_expires_at = NULL '
    "WHERE lease_owner IS NOT NULL OR lease_expires_at IS NOT NULL"
)

#: Called with each step's line.
Say = Callable[[str], None]


class RestoreRefused(StoreError):
    """The restore did not happen: nothing was changed."""


class RestoreFailed(StoreError):
    """The restore stopped part way."""


@dataclass(frozen=True)
class Source:
    """The copy to restore, checked: its schema version, events and size in bytes."""

    path: Path
    version: int
    events: int
    size: int


def restore(inbox: Path, src: Path, say: Say) -> None:
    """Put the copy at ``src`` in place of the inbox at ``inbox``; see the module."""
    inbox, src = inbox.absolute(), src.absolute()
    if inbox.exists() and src.exists() and src.samefile(inbox):
        raise RestoreRefused(f"{src} is the inbox itself: name a copy of it; nothing was changed")
    source = check_source(src)
    say(
        f"checked {src}: a SQLite inbox at schema version {source.version}, "
        f"{source.events} events, {source.size} bytes, integrity ok"
    )
    if source.version < SCHEMA_VERSION:
        say(
            f"its schema version {source.version} is older than this release's "
            f"{SCHEMA_VERSION}: it is migrated at the next start (store.auto_migrate = true) "
            "or by `receiver migrate`, which first keep a copy of it beside the inbox"
        )
    try:
        inbox.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RestoreRefused(
            f"cannot create {inbox.parent} for the inbox: {exc.strerror}; nothing was changed"
        ) from exc
    with claimed(inbox, _quiet):  # in use: refused now, before the copy is written
        pass
    staged = _stage(source, inbox)
    leases = _clear_leases(staged)
    if leases:
        say(
            f"cleared {leases} leases of the processes that ran when the copy was taken: the "
            "work they held (not recorded as done) is taken up again at the next start"
        )
    try:
        with claimed(inbox, say):
            _swap(staged, inbox, say)
            sync_directory(inbox.parent)
            say(f"put a copy of {src} in place as {inbox} (synced to disk)")
    finally:
        with contextlib.suppress(OSError):
            staged.unlink()  # only while it is not in place
    say(
        f"released {inbox}: start the receiver; it sends nothing again that the copy records "
        "as delivered, and delivers what the copy holds as pending"
    )


def _quiet(_line: str) -> None:
    return None


def check_source(src: Path) -> Source:
    """Check the copy at ``src``, read-only (see the module)."""
    if not src.exists():
        raise RestoreRefused(f"{src}: no such file; nothing was changed")
    if not src.is_file():
        raise RestoreRefused(f"{src}: not a file; nothing was changed")
    try:
        with _read_only(src) as conn:
            problems = [str(row) for (row,) in conn.execute("PRAGMA integrity_check")]
            if problems != ["ok"]:
                raise RestoreRefused(
                    f"{src} is damaged: SQLite's integrity check found "
                    f"{'; '.join(problems[:2])}; nothing was changed"
                )
            ((version,),) = conn.execute(PRAGMA_USER_VERSION).fetchall()
            if version > SCHEMA_VERSION:
                raise StoreNewer(f"the copy {src}", int(version), SCHEMA_VERSION)
            ((events,),) = conn.execute("SELECT count(*) FROM events").fetchall()
    except sqlite3.Error as exc:
        raise RestoreRefused(f"{src} {_what_is_wrong(exc)}; nothing was changed") from exc
    if not version:
        raise RestoreRefused(f"{src} is not a receiver inbox (no schema); nothing was changed")
    return Source(src, int(version), int(events), src.stat().st_size)


@contextlib.contextmanager
def claimed(inbox: Path, say: Say, until: str = "restored") -> Iterator[sqlite3.Connection | None]:
    """Hold the inbox at ``inbox`` for this process alone, or refuse (see the module): leaving
    WAL mode needs sole access, and the exclusive lock taken next keeps it until the end.
    Gives the connection holding it (in rollback-journal mode), or None when there is no inbox
    or SQLite cannot read it."""
    if not inbox.exists():
        say(f"no inbox at {inbox} yet: nothing to move aside")
        yield None
        return
    try:
        conn = sqlite3.connect(inbox, timeout=CLAIM_SECONDS, isolation_level=None)
    except sqlite3.Error as exc:
        raise RestoreRefused(f"the inbox {inbox} cannot be opened ({exc})") from exc
    try:
        damaged = None
        try:
            conn.execute("PRAGMA journal_mode = DELETE").fetchall()
            conn.execute("PRAGMA locking_mode = EXCLUSIVE").fetchall()
            conn.execute("BEGIN EXCLUSIVE")
            conn.execute("COMMIT")  # the lock stays: locking_mode is EXCLUSIVE
            ((mode,),) = conn.execute("PRAGMA journal_mode").fetchall()
        except sqlite3.Error as exc:
            name = str(getattr(exc, "sqlite_errorname", ""))
            if _is_busy(exc):
                raise _in_use(inbox, exc) from exc
            if not name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
                raise RestoreRefused(
                    f"the inbox {inbox} could not be claimed ({exc}); nothing was changed"
                ) from exc
            damaged = exc
        if damaged is not None:
            # No receiver serves a file SQLite cannot read: it is moved aside as it is.
            conn.close()
            say(f"the inbox {inbox} is damaged ({damaged}): it is moved aside as it is")
        elif mode != "delete":  # a receiver started between the switch and the lock
            raise _in_use(inbox, f"it is in {mode} mode again")
        else:
            say(f"claimed {inbox}: no other process has it open; it stays locked until " + until)
        yield None if damaged is not None else conn
    finally:
        conn.close()


def _in_use(inbox: Path, why: object) -> RestoreRefused:
    return RestoreRefused(
        f"the inbox {inbox} is in use by another process ({why}): stop every `receiver "
        "serve` (and any command or sqlite3 shell) using it, then restore again; nothing was "
        "changed"
    )


def _stage(source: Source, inbox: Path) -> Path:
    """The copy written beside the inbox (temporary name), flushed to disk and read back."""
    staged = inbox.with_name(f"{inbox.name}.restoring-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        staged.unlink()  # this process's own name: left by nothing else
    try:
        with _read_only(source.path) as conn:
            vacuum_into(conn, staged)
        with _read_only(staged) as conn:
            ((version,),) = conn.execute(PRAGMA_USER_VERSION).fetchall()
            ((events,),) = conn.execute("SELECT count(*) FROM events").fetchall()
    except (sqlite3.Error, OSError) as exc:
        with contextlib.suppress(OSError):
            staged.unlink()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RestoreFailed(
            f"writing the copy beside the inbox failed ({reason}); the inbox {inbox} was left "
            "in place, unchanged"
        ) from exc
    if (version, events) != (source.version, source.events):
        staged.unlink()
        raise RestoreFailed(
            f"the copy written beside the inbox reads back differently ({events} events at "
            f"version {version}); the inbox {inbox} was left in place, unchanged"
        )
    _owned_as(staged, inbox)
    return staged


def _clear_leases(staged: Path) -> int:
    """Clear every lease in the staged copy; how many there were. A lease names a process of the
    receivers that ran when the copy was taken: none of them runs on the restored inbox, and the
    work it held would otherwise wait for the lease to expire."""
    cleared = 0
    try:
        with contextlib.closing(sqlite3.connect(staged, isolation_level=None)) as conn:
            conn.execute("PRAGMA journal_mode = DELETE")  # no -wal beside the staged copy
            tables = [name for (name,) in conn.execute(LEASED_TABLES)]
            conn.execute("BEGIN IMMEDIATE")
            for table in tables:
                cleared += conn.execute(CLEAR_LEASES.format(table=table)).rowcount
            conn.execute("COMMIT")
    except sqlite3.Error as exc:
        with contextlib.suppress(OSError):
            staged.unlink()
        raise RestoreFailed(
            f"clearing the copy's leases failed ({exc}); the inbox was left in place, unchanged"
        ) from exc
    return cleared


def _owned_as(staged: Path, inbox: Path) -> None:
    """Give the staged copy the inbox's permissions, and its owner where this process may (run
    as root, the copy would otherwise belong to root, and the receiver's user could not open
    it). By path only: no descriptor of the inbox is opened."""
    try:
        current = inbox.stat()
    except OSError:
        return  # no inbox yet: the copy keeps what SQLite gave it
    with contextlib.suppress(OSError):
        os.chmod(staged, stat.S_IMODE(current.st_mode))
    if os.geteuid() == 0:
        with contextlib.suppress(OSError):
            os.chown(staged, current.st_uid, current.st_gid)


def _swap(staged: Path, inbox: Path, say: Say) -> None:
    """Keep the inbox as ``<inbox>.before-restore-<UTC time>`` (and any ``-wal``, ``-shm`` or
    ``-journal`` beside it under that name too), then rename the staged copy to the inbox's
    name. The old inbox gets its new name as a second link first, so the inbox's name never
    stands free for a receiver to create a new file at."""
    stamp = stamp_now()
    aside = first_free(lambda n: copy_name(inbox, ASIDE_KIND, stamp, n))
    existed = inbox.exists()
    linked = existed and _link(inbox, aside)
    if existed and not linked:  # a filesystem without hard links
        os.rename(inbox, aside)
    if existed:
        say(f"moved the inbox {inbox} aside to {aside} (kept: delete it when not needed)")
    for suffix in SIDE_FILES:
        side = inbox.with_name(inbox.name + suffix)
        if side.exists():
            os.rename(side, aside.with_name(aside.name + suffix))
            say(f"moved {side} aside to {aside.name}{suffix} (it belongs to the old inbox)")
    try:
        if existed or not _link(staged, inbox):
            os.rename(staged, inbox)
    except FileExistsError as exc:
        raise RestoreRefused(
            f"a process created the inbox {inbox} meanwhile: stop every receiver using it, "
            "then restore again; the inbox was not replaced"
        ) from exc
    except OSError as exc:
        if linked:
            aside.unlink()  # the old inbox never left its name
        elif existed and not inbox.exists():
            os.rename(aside, inbox)
        raise RestoreFailed(
            f"the copy could not be renamed to {inbox} ({exc.strerror}); the old inbox is in place"
        ) from exc


def _link(path: Path, name: Path) -> bool:
    """Give ``path`` a second ``name`` (never replacing a file); False where the filesystem
    has no hard links. Raises ``FileExistsError`` when ``name`` exists."""
    try:
        os.link(path, name)
    except FileExistsError:
        raise
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _read_only(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to ``path``. With a ``-wal`` beside it, the WAL is read too;
    without one, the file is opened as immutable, so that nothing (no ``-shm``) is created
    beside it."""
    flags = "mode=ro" if path.with_name(path.name + "-wal").exists() else "mode=ro&immutable=1"
    conn = sqlite3.connect(f"file:{quote(str(path))}?{flags}", uri=True, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


def _what_is_wrong(exc: sqlite3.Error) -> str:
    name = str(getattr(exc, "sqlite_errorname", ""))
    if name.startswith("SQLITE_NOTADB"):
        return "is not a SQLite database"
    if name.startswith("SQLITE_CORRUPT"):
        return f"is damaged ({exc})"
    if "no such table" in str(exc):
        return f"is not a receiver inbox ({exc})"
    return f"cannot be read ({exc})"
