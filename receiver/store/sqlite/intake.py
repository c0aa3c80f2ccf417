"""The SQLite inbox's intake: a group of new events written with one multi-row INSERT a table,
its whole transaction in one hand-off to the intake connection's thread."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

from receiver.store import rules
from receiver.store.pull import admit
from receiver.store.sqlite.faults import _ITEM_ERRORS, _unavailable
from receiver.store.sqlite.pull import INSERT_OUTCOMES_HEAD, OUTCOME_ROW
from receiver.store.sqlite.schema import (
    BEGIN_WRITE,
    COMMIT,
    RELEASE_SAVEPOINT,
    ROLLBACK,
    ROLLBACK_SAVEPOINT,
    SAVEPOINT,
)

# Intake's one look before a group's inserts, one statement for both tables: (0, id, NULL) for
# each event id stored already (?1, the ids), (1, key, source) for each job outcome the ledger
# holds already (?2, the keys).
SELECT_STORED = """
SELECT 0, id, NULL FROM events WHERE id IN (SELECT value FROM json_each(?1))
UNION ALL
SELECT 1, key, source FROM job_outcomes WHERE key IN (SELECT value FROM json_each(?2))
"""

# A group of events goes in with one multi-row INSERT per table (see _rows_statement): one
# statement step for the whole group instead of one per row, each of which would hand the GIL
# back and forth with the event loop.
INSERT_EVENTS_HEAD = """
INSERT INTO events (
    id, event, job_id, body, headers, received_at, state, enrich_at, trace, stored_at
)
VALUES """
# stored_at: the time of the insert, just before its commit (SQLite's clock, milliseconds).
EVENT_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?, (julianday('now') - 2440587.5) * 86400.0)"
INSERT_DELIVERIES_HEAD = """
INSERT INTO deliveries (event_id, sink, state, attempts, next_attempt_at, last_error, updated_at)
VALUES """
DELIVERY_ROW = "(?, ?, 'pending', 0, ?, NULL, ?)"
#: One event's row without a trace (what bench/backlog.py fills an inbox with).
INSERT_EVENT = INSERT_EVENTS_HEAD + EVENT_ROW.replace("?, (julianday", "NULL, (julianday")
# 9 parameters a row: well under SQLite's 32766 parameters a statement.
ROWS_PER_STATEMENT = 256


def _rows_statement(head: str, row: str, count: int) -> str:
    """``head`` followed by ``count`` placeholder tuples (placeholders only, never values)."""
    return head + ", ".join([row] * count)


def _insert_rows(
    conn: sqlite3.Connection, head: str, row: str, rows: Sequence[tuple[Any, ...]]
) -> None:
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[start : start + ROWS_PER_STATEMENT]
        params = [value for values in chunk for value in values]
        conn.execute(_rows_statement(head, row, len(chunk)), params)


@dataclass(slots=True)
class _Add:
    row: tuple[Any, ...]
    deliveries: list[tuple[Any, ...]]
    # (key, event id, source, created at) for a job outcome event (see receiver.store.pull).
    outcome: tuple[str, str, str, float] | None = None

    def __post_init__(self) -> None:
        # Built in the caller's task (SqliteStore.add_event), so the refusal is its own alone.
        rules.refuse_unstorable(self.row[:3])  # id, event, job_id

    @property
    def id(self) -> str:
        return str(self.row[0])


def _stored(conn: sqlite3.Connection, adds: list[_Add]) -> tuple[set[str], dict[str, str]]:
    """Which of the group's event ids are stored already, and the ledger's source for each of
    its job outcomes held already: one statement (inside the intake transaction)."""
    ids = json.dumps([add.id for add in adds])
    keys = json.dumps([add.outcome[0] for add in adds if add.outcome is not None])
    seen: set[str] = set()
    held: dict[str, str] = {}
    for is_outcome, key, source in conn.execute(SELECT_STORED, (ids, keys)).fetchall():
        if is_outcome:
            held[key] = source
        else:
            seen.add(key)
    return seen, held


def _insert_new(conn: sqlite3.Connection, adds: list[_Add]) -> list[bool]:
    """Insert the events whose id is not stored yet; for each add, whether it was new."""
    seen, held = _stored(conn, adds)
    fresh: list[_Add] = []
    results: list[bool] = []
    outcomes: list[tuple[str, str, str, float]] = []
    for add in adds:
        is_new = add.id not in seen
        if is_new and add.outcome is not None:
            key, _event_id, source, _created = add.outcome
            is_new, record = admit(held, key, source)
            if record:
                outcomes.append(add.outcome)
        results.append(is_new)
        if is_new:
            seen.add(add.id)
            fresh.append(add)
    if outcomes:
        _insert_rows(conn, INSERT_OUTCOMES_HEAD, OUTCOME_ROW, outcomes)
    if fresh:
        _insert_rows(conn, INSERT_EVENTS_HEAD, EVENT_ROW, [add.row for add in fresh])
        deliveries = [row for add in fresh for row in add.deliveries]
        if deliveries:
            _insert_rows(conn, INSERT_DELIVERIES_HEAD, DELIVERY_ROW, deliveries)
    return results


def _insert_each(
    conn: sqlite3.Connection, adds: list[_Add], path: Path
) -> list[bool | BaseException]:
    """The group inserted one event at a time, each in a savepoint, so that an event whose
    values SQLite refuses fails alone (its caller gets the error, the others their result)."""
    results: list[bool | BaseException] = []
    for add in adds:
        conn.execute(SAVEPOINT)
        try:
            results += _insert_new(conn, [add])
        except _ITEM_ERRORS as exc:
            conn.execute(ROLLBACK_SAVEPOINT)
            results.append(_unavailable(exc, path))
        conn.execute(RELEASE_SAVEPOINT)
    return results


def _write_group(
    conn: sqlite3.Connection, adds: list[_Add], path: Path
) -> list[bool | BaseException]:
    """The whole group's transaction, run on the connection's own thread from start to end."""
    conn.execute(BEGIN_WRITE)
    try:
        try:
            results: list[bool | BaseException] = list(_insert_new(conn, adds))
        except _ITEM_ERRORS:
            # One event's values are unacceptable: write them one by one so only it fails.
            conn.execute(ROLLBACK)
            conn.execute(BEGIN_WRITE)
            results = _insert_each(conn, adds, path)
        conn.execute(COMMIT)
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute(ROLLBACK)
        raise
    return results


async def write_group(
    conn: aiosqlite.Connection, adds: list[_Add], path: Path
) -> list[bool | BaseException]:
    """Write one group of new events in one transaction, in a single hand-off to the
    connection's thread.

    Awaiting each statement on its own (BEGIN, three SELECTs and INSERTs, COMMIT) would hand
    the group to the event loop and back seven times; under load each hand-off waits for a
    whole turn of a busy loop, and the group's transaction, which holds SQLite's write lock,
    takes that many turns. ``_execute`` is aiosqlite's own way to run a function on the
    connection's thread (what its public methods are built on).
    """
    results: list[bool | BaseException] = await conn._execute(  # type: ignore[no-untyped-call]
        _write_group, conn._conn, adds, path
    )
    return results
