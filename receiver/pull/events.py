"""The events pull mode puts in the inbox, shaped like the upstream's webhooks.

A watched job that finished becomes the webhook the upstream would have sent: ``job.completed``
or ``job.failed`` naming the job. A reconcile run makes one ``job.completed`` per job, naming in
``asset_ids`` the job's completed assets it found in the collection (keyed by asset type, as a
webhook names them), so the worker fetches exactly those assets fresh. Both carry
``"source": "poll"`` or ``"reconcile"`` beside the webhook fields.

Their ids are derived from the source, the outcome and the job id (UUID version 5): the same
outcome found twice by the same means gets the same id, so a poller that stored an event and
died before recording it, or a second reconcile run, stores nothing new.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from receiver.config import Settings
from receiver.store.base import NewEvent

#: The namespace of the ids of events the receiver makes (a fixed, random UUID).
EVENT_NAMESPACE = uuid.UUID("5d0c5e0e-4a55-4b5e-9a3c-6f1d2b8e7c41")
OUTCOME_BY_STATUS = {"completed": "job.completed", "failed": "job.failed"}


def event_id(source: str, event: str, job_id: str) -> str:
    """The stable id of the ``event`` of ``job_id`` found by ``source``."""
    return str(uuid.uuid5(EVENT_NAMESPACE, f"{source}:{event}:{job_id}"))


def outcome_event(
    settings: Settings,
    *,
    source: str,
    event: str,
    job_id: str,
    now: float,
    job_type: str | None = None,
    asset_ids: Mapping[str, str] | None = None,
) -> NewEvent:
    """The inbox event for a job outcome found by ``source`` (``poll`` or ``reconcile``)."""
    ident = event_id(source, event, job_id)
    body: dict[str, Any] = {
        "id": ident,
        "object": "event",
        "event": event,
        "job_id": job_id,
        "timestamp": datetime.fromtimestamp(now, UTC).isoformat().replace("+00:00", "Z"),
        "source": source,
    }
    if job_type:
        body["type"] = job_type
    if asset_ids:
        body["asset_ids"] = dict(asset_ids)
    return NewEvent(
        id=ident,
        event=event,
        job_id=job_id,
        body=json.dumps(body, separators=(",", ":")).encode(),
        headers={"Service-Event-Id": ident, "X-Service-Event": event},
        received_at=now,
        sinks=settings.sinks_for_event(event),
        source=source,
    )
