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
