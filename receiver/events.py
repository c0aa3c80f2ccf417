"""The enriched event: the webhook body with its fresh job and assets, as every sink receives it.

This module depends on nothing else in ``receiver`` so that any layer (configuration checks,
templates, sinks, the worker) can name the event types without an import cycle.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


def iso_time(ts: float) -> str:
    """A unix time as ISO 8601 in UTC with milliseconds."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class FileRef:
    """One file to fetch for an event: a fresh asset, or one of the fresh job's ``urls``."""

    asset_type: str
    asset_id: str
    url: str
    collection_id: str | None
    item_name: str | None


@dataclass(frozen=True)
class Enriched:
    """The webhook body, the fresh job and its fresh assets: what every sink is handed."""

    event_id: str
    event_name: str
    payload: Mapping[str, Any]
    job: Mapping[str, Any]
    assets: tuple[Mapping[str, Any], ...]
    files: tuple[FileRef, ...]
    received_at: float
    processed_at: float
    #: The W3C traceparent of the delivery attempt's span (tracing on), carried by every sink.
    traceparent: str | None = None
    _json: list[bytes] = field(default_factory=list, compare=False, repr=False)

    @property
    def job_id(self) -> str:
        return str(self.job.get("id") or self.payload.get("job_id") or "")

    @property
    def job_type(self) -> str | None:
        value = self.job.get("type") or self.payload.get("type")
        return str(value) if value is not None else None

    def as_json(self) -> dict[str, Any]:
        """The contract's enriched event object."""
        return {
            "event": dict(self.payload),
            "job": dict(self.job),
            "assets": [dict(a) for a in self.assets],
            "received_at": iso_time(self.received_at),
            "processed_at": iso_time(self.processed_at),
        }

    def to_bytes(self) -> bytes:
        """The enriched event as compact UTF-8 JSON (computed once, shared by every sink)."""
        if not self._json:
            self._json.append(
                json.dumps(self.as_json(), separators=(",", ":"), ensure_ascii=False).encode()
            )
        return self._json[0]
