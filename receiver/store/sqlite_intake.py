"""The SQLite inbox's intake: a group of new events written with one multi-row INSERT a table."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

from receiver.store.pull import admit
from receiver.store.sqlite_faults import _ITEM_ERRORS, _unavailable
from receiver.store.sqlite_pull import INSERT_OUTCOME, held_outcomes
from receiver.store.sqlite_schema import RELEASE_SAVEPOINT, ROLLBACK_SAVEPOINT, SAVEPOINT
from receiver.store.sqlite_sql import (
    DELIVERY_ROW,
    EVENT_ROW,
    INSERT_DELIVERIES_HEAD,
    INSERT_EVENTS_HEAD,
    ROWS_PER_STATEMENT,
    SELECT_EXISTING_IDS,
)


def _rows_statement(head: str, row: str, count: int) -> str:
    """``head`` followed by ``count`` placeholder tuples (placeholders only, never values)."""
    return head + ", ".join([row] * count)


async def _insert_rows(
    conn: aiosqlite.Connection, head: str, row: str, rows: Sequence[tuple[Any, ...]]
) -> None:
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[start : start + ROWS_PER_STATEMENT]
        params = [value for values in chunk for value in values]
        await conn.execute(_rows_statement(head, row, len(chunk)), params)


@dataclass(slots=True)
class _Add:
    row: tuple[Any, ...]
    deliveries: list[tuple[Any, ...]]
    # (key, event id, source, created at) for a job outcome event (see receiver.store.pull).
    outcome: tuple[str, str, str, float] | None = None

    @property
    def id(self) -> str:
        return str(self.row[0])


async def _insert_new(conn: aiosqlite.Connection, adds: list[_Add]) -> list[bool]:
    """Insert the events whose id is not stored yet; for each add, whether it was new."""
    ids = json.dumps([add.id for add in adds])
    seen = {row[0] for row in await conn.execute_fetchall(SELECT_EXISTING_IDS, (ids,))}
    held = await held_outcomes(conn, [add.outcome[0] for add in adds if add.outcome is not None])
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
        await conn.executemany(INSERT_OUTCOME, outcomes)
    if fresh:
        await _insert_rows(conn, INSERT_EVENTS_HEAD, EVENT_ROW, [add.row for add in fresh])
        deliveries = [row for add in fresh for row in add.deliveries]
        if deliveries:
            await _insert_rows(conn, INSERT_DELIVERIES_HEAD, DELIVERY_ROW, deliveries)
    return results


def insert_each(
    adds: list[_Add], path: Path
) -> Callable[[aiosqlite.Connection], Awaitable[list[bool | BaseException]]]:
    """The group inserted one event at a time, each in a savepoint, so that an event whose
    values SQLite refuses fails alone (its caller gets the error, the others their result)."""

    async def run(conn: aiosqlite.Connection) -> list[bool | BaseException]:
        results: list[bool | BaseException] = []
        for add in adds:
            await conn.execute(SAVEPOINT)
            try:
                results += await _insert_new(conn, [add])
            except _ITEM_ERRORS as exc:
                await conn.execute(ROLLBACK_SAVEPOINT)
                results.append(_unavailable(exc, path))
            await conn.execute(RELEASE_SAVEPOINT)
        return results

    return run
