"""The simulator's records: job kinds, jobs, assets and webhook subscriptions, as plain data."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

#: The default API key (the spec's format: ``service_`` and 64 hex characters).
DEFAULT_API_KEY = "service_" + "0123456789abcdef" * 4

EVENT_NAMES = ("job.completed", "job.failed")
TERMINAL_STATUSES = frozenset({"completed", "failed"})
#: Formats the upstream derives after the parent job has completed.
DERIVED_TYPES = frozenset({"webm", "hevc", "stacked_video"})


@dataclass(frozen=True)
class JobKind:
    """What one ``add_job`` kind produces: the upstream job type, asset types and cost."""

    job_type: str
    asset_types: tuple[str, ...]
    cost_credits: float


#: ``add_job`` kinds. Costs follow the spec (animation: 5 per second, 4 s by default).
KINDS: dict[str, JobKind] = {
    "image": JobKind("image_generation", ("image", "transparent_image"), 1),
    "animation": JobKind("animation", ("video", "webm", "hevc", "stacked_video"), 20),
    "logo": JobKind("logo", ("logo",), 5),
    "scene": JobKind("scene_generation", ("scene",), 3),
}
COST_BY_JOB_TYPE = {kind.job_type: kind.cost_credits for kind in KINDS.values()}
POSES = ("idle", "wave", "jump", "celebrate", "thinking", "sleepy", "surprised", "run")


def iso(ts: float) -> str:
    """A unix time as an ISO 8601 UTC string with milliseconds."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class SimAsset:
    """One file the simulator serves."""

    id: str
    type: str
    job_id: str
    item_id: str | None
    collection_id: str | None
    content_type: str
    ext: str
    data: bytes
    created: float

    @property
    def file_name(self) -> str:
        return f"{self.id}{self.ext}"


@dataclass
class SimJob:
    """One job. ``finished`` is when it completed or failed (``None`` while held processing)."""

    id: str
    type: str
    event_id: str
    collection_id: str | None
    item_id: str | None
    item_name: str | None
    mascot_id: str | None
    cost_credits: float
    created: float
    finished: float | None
    outcome: str
    error: str | None = None
    asset_ids: dict[str, str] = field(default_factory=dict)


@dataclass
class SimWebhook:
    """One webhook subscription."""

    id: str
    url: str
    events: list[str]
    secret: str
    created: float
    active: bool = True
    consecutive_failures: int = 0

    def as_json(self, *, with_secret: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "url": self.url,
            "events": list(self.events),
            "active": self.active,
            "consecutive_failures": self.consecutive_failures,
            "created_at": iso(self.created),
        }
        if with_secret:
            data["secret"] = self.secret
        return data
