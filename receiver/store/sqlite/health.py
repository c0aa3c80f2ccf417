"""The SQLite inbox's check at start, and the repair of its indexes.

When ``receiver serve`` starts on a SQLite inbox, before anything else touches the file, it runs
``PRAGMA integrity_check`` on it for at most :data:`CHECK_SECONDS` (a progress handler stops it
there). The check reads the whole file, every table and every index, and compares each index
with its table (``PRAGMA quick_check`` is about six times faster but never looks at what an
index holds, so it says ``ok`` on exactly the damage below). On an inbox of a million events it
takes about 12 s on a warm page cache: a larger inbox is only partly checked, and one line says
so (the problems found before the stop still count).

What it finds decides what happens:

- **Nothing**: the start goes on, without a word.
- **Only indexes are wrong** (``wrong # of entries in index X``, ``row N missing from index X``,
  ``non-unique entry in index X`` and the like): indexes hold nothing of their own, everything
  in them is rebuilt from the tables. The receiver first writes a copy of the inbox beside it
  (``VACUUM INTO '<inbox>.before-reindex-<UTC time>'``: the file as it was, damage included),
  then runs ``REINDEX`` and checks again. One warning line names the indexes and the copy; the
  start goes on. Delete the copy once the receiver has run well for a while.
- **Anything worse** (a table's pages, ``database disk image is malformed``, a ``REINDEX`` that
  fails, e.g. two rows where a unique key allows one, or problems left after it): the receiver
  does not start. One line on stderr says what was found and points to the section "A damaged
  SQLite inbox" of docs/operations.md; the file is left as it was.

Only the serving process checks (``SqliteStore(check=True)``, from :mod:`receiver.server`):
commands such as ``receiver events list`` open the inbox without it. Teams whose receiver ran
the release whose checkpointer dropped SQLite's locks (see :mod:`.checkpoints`) may have inboxes
with wrong indexes; this is what finds and mends them.

Everything here goes through SQLite connections, never a descriptor of our own: closing any
descriptor of the database file drops every POSIX lock this process holds on it (SQLite's "How
To Corrupt An SQLite Database File", 2.2.1).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from receiver.errors import StoreDamaged, StoreError
from receiver.logs import get_logger
from receiver.store.sqlite.backup_copy import write_copy
from receiver.store.sqlite.faults import _unavailable
from receiver.store.sqlite.schema import BEGIN_WRITE, COMMIT, ROLLBACK
from receiver.store.sqlite.writer_turns import WriterTurns

T = TypeVar("T")

log = get_logger("receiver.store.sqlite.health")

#: How long the start-up integrity check may run (each time: before and after a repair).
#: About 800,000 events' worth on a warm cache; at most two of these, a copy of the file and a
#: REINDEX stay well within a minute (the shipped Kubernetes startup probe allows 60 s).
CHECK_SECONDS = 10.0
#: The progress handler looks at the clock every this many SQLite VM instructions.
PROGRESS_STEPS = 1000
#: Where a user whose inbox is damaged is sent.
DOCS = "docs/operations.md#a-damaged-sqlite-inbox"
#: How many of the problems found a message quotes.
QUOTED = 2

#: The integrity check stops after this many problems (SQLite's default); with as many, the
#: damaged indexes it named may not be all of them.
MAX_PROBLEMS = 100

INTEGRITY_CHECK = f"PRAGMA integrity_check({MAX_PROBLEMS})"
INDEX_NAMES = "SELECT name FROM sqlite_schema WHERE type = 'index'"
REINDEX = "REINDEX"

# The integrity check's messages about an index alone (SQLite's pragma.c): what REINDEX, which
# rebuilds every index from its table, mends. Any other message is about a table, a page or the
# file, which REINDEX does not touch. ("rowid N missing" is the older releases' form.)
_INDEX_PROBLEMS = tuple(
    re.compile(pattern)
    for pattern in (
        r"wrong # of entries in index (?P<index>\S+)",
        r"row(?:id)? -?\d+ missing from index (?P<index>\S+)",
        r"row -?\d+ values differ from index (?P<index>\S+)",
        r"rowid not at end-of-record for row -?\d+ of index (?P<index>\S+)",
        r"non-unique entry in index (?P<index>\S+)",
    )
)


@dataclass(frozen=True)
class Findings:
    """What one integrity check said: its problems (none when it said ``ok``), and, when it
    did not run to its end, why (the problems found until then are real all the same)."""

    problems: tuple[str, ...]
    stopped: str | None = None


async def check_inbox(path: Path, turns: WriterTurns, *, busy_timeout: float) -> None:
    """Check the inbox at ``path`` and, if its indexes alone are wrong, keep a copy of it and
    rebuild them (see the module); raise :class:`~receiver.errors.StoreDamaged` when it must
    not be served, :class:`~receiver.errors.StoreUnavailable` when it cannot be read at all.

    The check only reads; the copy and the repair run in the writers' turn (``turns``) of the
    processes sharing the file."""
    seconds = CHECK_SECONDS
    inbox = _Inbox(path, busy_timeout)
    found = await _on_thread(functools.partial(inbox.integrity_check, seconds))
    if not found.problems:
        if found.stopped:
            log.warning(
                f"inbox check {found.stopped}, so it is incomplete (nothing found in what it "
                f"read); the receiver starts; for a full check see {DOCS}",
                path=str(path),
            )
        return
    indexes = await _on_thread(functools.partial(inbox.damaged_indexes, found.problems))
    if indexes is None:
        raise StoreDamaged(
            f"the inbox database {path} is damaged ({_quote(found.problems)}); the receiver "
            f"does not start on it and left it as it was: see {DOCS}"
        )
    # A whole check named every damaged index; after a partial one, all are rebuilt. (Another
    # process starting at the same time may have rebuilt them meanwhile: doing it again is
    # only time, and a second copy.)
    rebuild = None if found.stopped else indexes
    async with turns:
        backup = await _on_thread(functools.partial(inbox.back_up, found.problems))
        await _on_thread(functools.partial(inbox.reindex, backup, rebuild))
    after = await _on_thread(functools.partial(inbox.integrity_check, seconds))
    if after.problems:
        raise StoreDamaged(
            f"the inbox database {path} is still damaged after REINDEX rebuilt its indexes "
            f"({_quote(after.problems)}); the receiver does not start on it; the file as it "
            f"was before the REINDEX is at {backup}: see {DOCS}"
        )
    log.warning(
        "inbox indexes were damaged: rebuilt with REINDEX, the file as it was kept beside it",
        path=str(path),
        indexes=indexes,
        rebuilt="every index" if rebuild is None else "these indexes",
        backup=str(backup),
        check=found.stopped or "complete",
        check_after=f"{after.stopped}, nothing found" if after.stopped else "ok",
    )


async def _on_thread(job: Callable[[threading.Event], T]) -> T:
    """Run ``job(cancelled)`` on a thread; cancelling the caller sets ``cancelled``, which
    interrupts the statement running (a REINDEX interrupted is undone whole)."""
    cancelled = threading.Event()
    task = asyncio.ensure_future(asyncio.to_thread(job, cancelled))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        cancelled.set()
        with contextlib.suppress(BaseException):
            await task
        raise


@dataclass(frozen=True)
class _Inbox:
    """The steps of :func:`check_inbox`, each on a connection of its own, run on a thread."""

    path: Path
    busy_timeout: float

    @contextlib.contextmanager
    def _connect(
        self, cancelled: threading.Event, deadline: float = math.inf
    ) -> Iterator[sqlite3.Connection]:
        """A connection whose statements stop (``SQLITE_INTERRUPT``) at ``deadline``
        (``time.monotonic()``) or once ``cancelled`` is set."""

        def stop() -> int:
            return 1 if cancelled.is_set() or time.monotonic() >= deadline else 0

        try:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._unreadable(exc) from exc
        try:
            conn.set_progress_handler(stop, PROGRESS_STEPS)
            yield conn
        finally:
            conn.close()

    def integrity_check(self, seconds: float, cancelled: threading.Event) -> Findings:
        deadline = time.monotonic() + seconds
        problems: list[str] = []
        with self._connect(cancelled, deadline) as conn:
            try:
                # Row by row: the rows read before a stop are kept.
                for (message,) in conn.execute(INTEGRITY_CHECK):
                    if message != "ok":
                        problems.append(str(message))
            except sqlite3.Error as exc:
                if _interrupted(exc) and not cancelled.is_set():
                    return Findings(tuple(problems), f"cut short after {seconds:g} s")
                raise self._unreadable(exc) from exc
        if len(problems) >= MAX_PROBLEMS:
            return Findings(tuple(problems), f"stopped at its first {MAX_PROBLEMS} problems")
        return Findings(tuple(problems))

    def damaged_indexes(
        self, problems: Sequence[str], cancelled: threading.Event
    ) -> list[str] | None:
        """The indexes ``problems`` are about, in the order first named; None unless every
        one of them is about an index of this file alone."""
        with self._connect(cancelled) as conn:
            try:
                known = {str(name) for (name,) in conn.execute(INDEX_NAMES)}
            except sqlite3.Error as exc:
                raise self._unreadable(exc) from exc
        named: list[str] = []
        for problem in problems:
            index = _index_named(problem)
            if index is None or index not in known:
                return None
            if index not in named:
                named.append(index)
        return named

    def back_up(self, problems: Sequence[str], cancelled: threading.Event) -> Path:
        """Write a copy of the inbox beside it (SQLite's ``VACUUM INTO``: one consistent
        snapshot, WAL included, damage included: :mod:`.backup_copy`); its path."""
        with self._connect(cancelled) as conn:
            try:
                return write_copy(conn, self.path, "before-reindex")
            except (sqlite3.Error, OSError) as exc:
                raise StoreDamaged(
                    f"the inbox database {self.path} has damaged indexes "
                    f"({_quote(problems)}), and the copy to keep before rebuilding them could "
                    f"not be written beside it ({exc}); nothing was changed, the receiver "
                    f"does not start: see {DOCS}"
                ) from exc

    def reindex(
        self, backup: Path, indexes: Sequence[str] | None, cancelled: threading.Event
    ) -> None:
        """Rebuild ``indexes`` (None: every index) from their tables, in one transaction."""
        names = [REINDEX] if indexes is None else [f"{REINDEX} {_quoted(i)}" for i in indexes]
        with self._connect(cancelled) as conn:
            try:
                conn.execute(BEGIN_WRITE)
                try:
                    for statement in names:
                        conn.execute(statement)
                    conn.execute(COMMIT)
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute(ROLLBACK)
                    raise
            except sqlite3.Error as exc:
                if cancelled.is_set():
                    raise
                raise StoreDamaged(
                    f"the inbox database {self.path} has damaged indexes that REINDEX could "
                    f"not rebuild ({exc}); the receiver does not start on it and left it as it "
                    f"was (a copy is also at {backup}): see {DOCS}"
                ) from exc

    def _unreadable(self, exc: sqlite3.Error) -> StoreError:
        """A damaged file (``SQLITE_CORRUPT``, ``SQLITE_NOTADB``) as :class:`StoreDamaged`,
        any other fault as the store's other faults at open (locked, unreadable, ...)."""
        if _errorname(exc).startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
            error = StoreDamaged(
                f"the inbox database {self.path} is damaged ({exc}); the receiver does not "
                f"start on it and left it as it was: see {DOCS}"
            )
            error.__cause__ = exc
            return error
        return _unavailable(exc, self.path)


def _errorname(exc: BaseException) -> str:
    return str(getattr(exc, "sqlite_errorname", ""))


def _interrupted(exc: BaseException) -> bool:
    return _errorname(exc) == "SQLITE_INTERRUPT"


def _index_named(problem: str) -> str | None:
    """The index a problem of an index alone is about, else None."""
    for pattern in _INDEX_PROBLEMS:
        match = pattern.fullmatch(problem)
        if match:
            return match.group("index")
    return None


def _quoted(name: str) -> str:
    """An identifier, quoted for SQL."""
    return '"' + name.replace('"', '""') + '"'


def _quote(problems: Sequence[str]) -> str:
    """The first problems, on one line, and how many more."""
    quoted = [" ".join(p.split())[:160] for p in problems[:QUOTED]]
    more = len(problems) - len(quoted)
    return "; ".join(quoted) + (f"; and {more} more" if more else "")
