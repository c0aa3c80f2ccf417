"""Events for store tests: a fixed clock start, a new event with two sinks, delivery states."""

from __future__ import annotations

from typing import Any

from receiver.store import NewEvent

T0 = 1_700_000_000.0


def new_event(
    event_id: str,
    *,
    sinks: tuple[str, ...] = ("alpha", "beta"),
    received_at: float = T0,
    event: str = "job.completed",
    body: bytes | None = None,
) -> NewEvent:
    payload = body if body is not None else b'{"id": "%s", "object": "event"}' % event_id.encode()
    return NewEvent(
        id=event_id,
        event=event,
        job_id=f"job-{event_id}",
        body=payload,
        headers={"Service-Event-Id": event_id, "Content-Type": "application/json"},
        received_at=received_at,
        sinks=sinks,
    )


def states(record: Any) -> dict[str, str]:
    return {d.sink: d.state for d in record.deliveries}


#: Ids (and job ids) that every store keeps and finds again: control characters but NUL, C1,
#: separators, non-BMP characters, JSON's own escapes, 255 characters.
ODD_IDS = (
    "ev-\x01\x1f",
    "ev-\r\n",
    "ev-\t",
    "ev-\x7f\x85\x9f",
    "ev-\u2028\u2029",
    "ev-é-✓-😀",
    'ev-"\\u0000\\',
    "e" * 255,
)
#: Values no store keeps in an id, event name or job id (Postgres text holds no NUL; SQLite's
#: JSON functions end a string at one; UTF-8 has no lone surrogate): refused, every time.
UNSTORABLE_IDS = ("ev-\x00", "\x00", "ev-\x00-\x00tail", "ev-é\x00", "ev-\ud800", "\udfff")


async def redeliver(store: Any, *, now: float, **fields: Any) -> int:
    """Send deliveries again as every caller does (a batch, its first step queued at once):
    ``fields`` make the filter (default: every dead delivery); how many were queued."""
    from receiver.delivery.redelivery import start
    from receiver.store.batches import RedeliveryFilter

    if "sinks" in fields:
        fields["sinks"] = tuple(fields["sinks"])
    batch = await start(store, RedeliveryFilter(**fields), created_by="tests", now=now)
    return batch.queued


async def records(store: Any, *event_ids: str) -> dict[str, Any]:
    """Each event as the store reads it now (its deliveries, states and enrichment), by id."""
    found = {}
    for event_id in event_ids:
        record = await store.get(event_id)
        assert record is not None, event_id
        found[event_id] = record
    return found


def delivery(record: Any, sink: str) -> Any:
    """The delivery of ``record`` to ``sink``."""
    [found] = [d for d in record.deliveries if d.sink == sink]
    return found
