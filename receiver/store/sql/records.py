"""Reading events with their deliveries, and keeping each event's state, in both SQL dialects."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from receiver.errors import UnknownEvent
from receiver.store import rules
from receiver.store.records import EVENT_COLUMNS, EventRecord, EventState, event_records
from receiver.store.sql.conn import Conn


class RecordSql:
    """The statements a dialect runs for records, set by a backend's subclass
    (``<backend>/records.py``). ``:ids`` is a list of event ids."""

    #: Events (``EVENT_COLUMNS``) by ``:ids``.
    SELECT_EVENTS: ClassVar[str]
    #: Their deliveries (``DELIVERY_COLUMNS``) by ``:ids``, ordered by event id and sink.
    SELECT_DELIVERIES: ClassVar[str]
    #: ``(event_id, state)`` of the deliveries of ``:ids``.
    SELECT_DELIVERY_STATES: ClassVar[str]
    #: Sets each event of ``:ids`` to the state at the same place in ``:states``, if it differs.
    SET_EVENT_STATES: ClassVar[str]
    #: The event ``:event_id``'s id (locked until the transaction ends, where writers lock rows).
    LOCK_EVENT: ClassVar[str]
    #: Whether writers lock the rows they change: several processes write at once (Postgres),
    #: rather than one writer at a time (SQLite, whose write transaction holds the whole file).
    LOCKS_ROWS: ClassVar[bool]
    SELECT_EVENT: ClassVar[str] = "SELECT " + EVENT_COLUMNS + " FROM events WHERE id = :event_id"


async def with_deliveries(
    c: Conn, sql: type[RecordSql], rows: Sequence[Sequence[Any]]
) -> list[EventRecord]:
    """EventRecords for event rows (``EVENT_COLUMNS`` first), with their deliveries by sink."""
    if not rows:
        return []
    deliveries = await c.rows(sql.SELECT_DELIVERIES, {"ids": [row[0] for row in rows]})
    return event_records(rows, deliveries)


async def records(c: Conn, sql: type[RecordSql], event_ids: list[str]) -> list[EventRecord]:
    return await with_deliveries(c, sql, await c.rows(sql.SELECT_EVENTS, {"ids": event_ids}))


async def lock_event(c: Conn, sql: type[RecordSql], event_id: str) -> None:
    """Lock the event's row (where writers lock rows); UnknownEvent when there is none."""
    if await c.value(sql.LOCK_EVENT, {"event_id": event_id}) is None:
        raise UnknownEvent(f"no event {event_id!r} in the inbox")


async def recompute(c: Conn, sql: type[RecordSql], event_ids: list[str]) -> dict[str, EventState]:
    """Set each event's state from its deliveries (:func:`rules.event_state`); the new states."""
    rows = await c.rows(sql.SELECT_DELIVERY_STATES, {"ids": event_ids})
    states = rules.event_states(event_ids, rows)
    await c.run(sql.SET_EVENT_STATES, {"ids": list(states), "states": list(states.values())})
    return states
