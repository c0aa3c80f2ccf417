"""The events pull mode puts in the inbox, shaped like the upstream's webhooks.

A watched job that finished becomes the webhook the upstream would have sent: ``job.completed``
or ``job.failed`` naming the job, with ``"source": "poll"``. Its id is derived from the outcome
and the job id (UUID version 5): the same outcome found twice gets the same id, so a poller that
stored an event and died before recording it stores nothing new.

A reconcile run makes a ``job.completed`` per *unit* (the job the assets name, else their
item, else the asset alone) naming in ``asset_ids`` the unit's completed assets no event has
taken yet (keyed by asset type, as a webhook names them), so the worker fetches exactly those
assets fresh, and sinks that filter on ``job.completed`` receive them. Beside the webhook fields
it carries ``"source": "reconcile"``, ``"reconcile_unit"`` (``job``, ``item`` or ``asset``),
``collection_id`` and, for an item, ``item_id``. For an item or asset unit there is no job to
fetch: ``job_id`` is an id made from the unit (:func:`unit_job_id`), and the enriched event's
``job`` is ``{"status": "completed"}``. Its id is derived from the unit and the set of assets, so
a second run finding the same assets stores nothing new.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from receiver.config.settings import Settings
from receiver.store.records import NewEvent

#: The namespace of the ids of events the receiver makes (a fixed, random UUID).
EVENT_NAMESPACE = uuid.UUID("5d0c5e0e-4a55-4b5e-9a3c-6f1d2b8e7c41")
OUTCOME_BY_STATUS = {"completed": "job.completed", "failed": "job.failed"}


def event_id(source: str, event: str, job_id: str) -> str:
    """The stable id of the ``event`` of ``job_id`` found by ``source``."""
    return str(uuid.uuid5(EVENT_NAMESPACE, f"{source}:{event}:{job_id}"))


def unit_job_id(unit: str, ident: str) -> str:
    """The job id of a reconciled event whose assets name no job: one per item or asset."""
    return str(uuid.uuid5(EVENT_NAMESPACE, f"reconcile-{unit}:{ident}"))


def reconcile_event(
    settings: Settings,
    *,
    unit: str,
    job_id: str,
    collection_id: str,
    item_id: str | None,
    assets: list[tuple[str, str]],
    now: float,
) -> NewEvent:
    """The inbox event for the ``assets`` (type, id) of one reconcile unit."""
    ids = sorted(asset_id for _type, asset_id in assets)
    ident = str(uuid.uuid5(EVENT_NAMESPACE, f"reconcile:{unit}:{job_id}:{','.join(ids)}"))
    asset_ids: dict[str, str] = {}
    for asset_type, asset_id in assets:
        key, n = asset_type, 1
        while key in asset_ids:
            n += 1
            key = f"{asset_type}_{n}"
        asset_ids[key] = asset_id
    extra: dict[str, Any] = {"reconcile_unit": unit, "collection_id": collection_id}
    if item_id is not None:
        extra["item_id"] = item_id
    return _new_event(
        settings,
        ident=ident,
        source="reconcile",
        event="job.completed",
        job_id=job_id,
        now=now,
        extra={"asset_ids": asset_ids, **extra},
    )


def outcome_event(
    settings: Settings,
    *,
    source: str,
    event: str,
    job_id: str,
    now: float,
    job_type: str | None = None,
) -> NewEvent:
    """The inbox event for a job outcome found by ``source`` (``poll``)."""
    extra: dict[str, Any] = {"type": job_type} if job_type else {}
    return _new_event(
        settings,
        ident=event_id(source, event, job_id),
        source=source,
        event=event,
        job_id=job_id,
        now=now,
        extra=extra,
    )


def _new_event(
    settings: Settings,
    *,
    ident: str,
    source: str,
    event: str,
    job_id: str,
    now: float,
    extra: Mapping[str, Any],
) -> NewEvent:
    body: dict[str, Any] = {
        "id": ident,
        "object": "event",
        "event": event,
        "job_id": job_id,
        "timestamp": datetime.fromtimestamp(now, UTC).isoformat().replace("+00:00", "Z"),
        "source": source,
        **extra,
    }
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
