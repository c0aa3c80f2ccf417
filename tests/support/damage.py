"""Damaging a (closed) SQLite inbox on purpose, the ways a lost WAL or torn writes leave one.

**Index entries missing or stale** (:func:`change_behind_index`): an index SQLite does not
know about is not maintained. With ``PRAGMA writable_schema = ON`` the index's row is taken out
of ``sqlite_schema`` (its b-tree pages stay where they are, untouched), rows of its table are
changed on a new connection (which reads the schema again, without that index), and the row is
put back as it was. The index now lacks the changed rows' new keys and still holds their old
ones, while every page is sound: ``PRAGMA integrity_check`` says ``row N missing from index X``
and ``wrong # of entries in index X`` (``quick_check`` says ``ok``), exactly what the inboxes
damaged by the checkpointer bug showed, and what ``REINDEX`` mends.

**Two rows with one unique key** (:func:`duplicate_event`): the same, for the ``events``
primary key (an automatic index, ``sqlite_autoindex_events_1``): the table's ``CREATE TABLE``
text loses its ``PRIMARY KEY`` and the automatic index its row, a copy of an event is inserted,
and both are put back. ``REINDEX`` then fails (``UNIQUE constraint failed: events.id``).

**A row the schema forbids** (:func:`null_where_forbidden`): the same again, for a
``NOT NULL`` constraint: ``NULL value in events.job_id``, which no index rebuild mends.

**A table's page destroyed** (:func:`break_table`): after folding the WAL into the file, the
b-tree page header of a table's root page (or of one of its leaves) is overwritten with bytes no
page starts with, as a torn or misdirected write would leave it. A broken root makes the
integrity check itself fail (``database disk image is malformed``); a broken leaf is one of
the problems it lists (``Tree N page M ...``).

Only for a file no process has open (they are test helpers, run between two opens).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

SCHEMA_ROW = "SELECT type, name, tbl_name, rootpage, sql FROM sqlite_schema WHERE name = ?"
PUT_BACK = "INSERT INTO sqlite_schema (type, name, tbl_name, rootpage, sql) VALUES (?, ?, ?, ?, ?)"


def _connect(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA writable_schema = ON")
    return conn


def _behind(db: Path, hide: Callable[[sqlite3.Connection], None], change: list[str]) -> None:
    """``hide`` the schema rows (on one connection), run ``change`` on a new one (which reads
    the schema without them), put the rows back."""
    with closing(_connect(db)) as conn:
        saved = list(conn.execute("SELECT type, name, tbl_name, rootpage, sql FROM sqlite_schema"))
        conn.execute("BEGIN")
        hide(conn)
        conn.execute("COMMIT")
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("BEGIN")
        for statement in change:
            conn.execute(statement)
        conn.execute("COMMIT")
    with closing(_connect(db)) as conn:
        conn.execute("BEGIN")
        conn.execute("DELETE FROM sqlite_schema")
        conn.executemany(PUT_BACK, saved)
        conn.execute("COMMIT")


def change_behind_index(db: Path, indexes: list[str], change: list[str]) -> None:
    """Run the statements ``change`` while SQLite does not know ``indexes``: they keep the
    entries of the rows before the change (see the module)."""

    def hide(conn: sqlite3.Connection) -> None:
        for index in indexes:
            assert conn.execute(SCHEMA_ROW, (index,)).fetchone(), index
            conn.execute("DELETE FROM sqlite_schema WHERE name = ?", (index,))

    _behind(db, hide, change)


def duplicate_event(db: Path, event_id: str) -> None:
    """A second ``events`` row with ``event_id`` (see the module)."""

    def hide(conn: sqlite3.Connection) -> None:
        (sql,) = conn.execute("SELECT sql FROM sqlite_schema WHERE name = 'events'").fetchone()
        plain = re.sub(r"\bTEXT PRIMARY KEY\b", "TEXT", sql, count=1)
        assert plain != sql
        conn.execute("UPDATE sqlite_schema SET sql = ? WHERE name = 'events'", (plain,))
        conn.execute("DELETE FROM sqlite_schema WHERE name = 'sqlite_autoindex_events_1'")

    columns = "event, job_id, body, headers, received_at, state"
    _behind(
        db,
        hide,
        [
            f"INSERT INTO events (id, {columns}) SELECT id, {columns} FROM events "
            f"WHERE id = '{event_id}'"
        ],
    )


def null_where_forbidden(db: Path, event_id: str) -> None:
    """``events.job_id`` (``NOT NULL``) set to NULL in one row, its constraint hidden meanwhile
    as :func:`duplicate_event` hides the key: a row no index holds the blame for."""

    def hide(conn: sqlite3.Connection) -> None:
        (sql,) = conn.execute("SELECT sql FROM sqlite_schema WHERE name = 'events'").fetchone()
        plain = re.sub(r"(job_id\s+TEXT) NOT NULL", r"\1", sql, count=1)
        assert plain != sql
        conn.execute("UPDATE sqlite_schema SET sql = ? WHERE name = 'events'", (plain,))

    _behind(db, hide, [f"UPDATE events SET job_id = NULL WHERE id = '{event_id}'"])


def break_table(db: Path, table: str, *, leaf: bool = False) -> None:
    """Overwrite the b-tree page header of ``table``'s root page, or, with ``leaf``, of its
    last leaf page (the root's right-most child), leaving the root sound (see the module)."""
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        (page,) = conn.execute(
            "SELECT rootpage FROM sqlite_schema WHERE name = ?", (table,)
        ).fetchone()
    with db.open("r+b") as f:  # no process has the file open
        if leaf:
            f.seek((page - 1) * page_size)
            header = f.read(12)
            assert header[0] == 0x05, "the table's root is not an interior page: add rows"
            page = int.from_bytes(header[8:12], "big")
        f.seek((page - 1) * page_size)
        f.write(b"\xff" * 12)


def integrity(db: Path) -> list[str]:
    """What ``PRAGMA integrity_check`` says of ``db`` (``["ok"]`` when sound)."""
    with closing(sqlite3.connect(db)) as conn:
        return [str(row[0]) for row in conn.execute("PRAGMA integrity_check")]
