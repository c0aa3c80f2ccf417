"""What the simulated upstream shows for its jobs and assets now: their states on its clock,
signed file URLs, and each object as the API answers it, in the simulator's shape
(:mod:`receiver.simulator.shape`). A mixin of :class:`~receiver.simulator.state.SimulatorState`,
which holds the records these read.
"""

from __future__ import annotations

import hashlib
import hmac
import random
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from receiver.simulator.model import DERIVED_TYPES, SimAsset, SimJob, iso
from receiver.simulator.shape import (
    ASSET_NULLABLE,
    ASSET_OPTIONAL,
    ASSET_OPTIONAL_NULLABLE,
    JOB_NULLABLE,
    JOB_OPTIONAL,
    JOB_OPTIONAL_NULLABLE,
    PRESENT,
    Shape,
)


class SimulatorViews:
    """The views and fault rolls of :class:`~receiver.simulator.state.SimulatorState`."""

    jobs: dict[str, SimJob]
    assets: dict[str, SimAsset]
    shape: Shape
    now: Callable[[], float]
    random: random.Random
    public_base_url: str | None
    url_ttl_seconds: float
    job_pending_for_seconds: float
    derived_delay_seconds: float
    derived_missing: bool
    expired_urls: bool
    expired_url_fraction: float
    _url_key: bytes

    # ----------------------------------------------------------------- views

    def _ready_at(self, job: SimJob) -> float | None:
        if job.finished is None:
            return None
        return max(job.finished, job.created + self.job_pending_for_seconds)

    def job_status(self, job_id: str) -> str:
        """``processing``, ``completed`` or ``failed``, on the simulator's clock."""
        job = self.jobs[job_id]
        ready = self._ready_at(job)
        if ready is None or self.now() < ready:
            return "processing"
        return job.outcome

    def asset_status(self, asset_id: str) -> str:
        """``processing`` until the job completed (plus the derived delay), then ``completed``."""
        asset = self.assets[asset_id]
        job = self.jobs[asset.job_id]
        status = self.job_status(job.id)
        if status != "completed":
            return status
        ready = self._ready_at(job)
        if (
            asset.type in DERIVED_TYPES
            and ready is not None
            and self.now() < ready + self.derived_delay_seconds
        ):
            return "processing"
        return "completed"

    def asset_missing(self, asset_id: str) -> bool:
        """Whether a derived asset does not exist yet (``derived_missing``, its job complete,
        the derived delay not over)."""
        asset = self.assets[asset_id]
        return (
            self.derived_missing
            and asset.type in DERIVED_TYPES
            and self.job_status(asset.job_id) == "completed"
            and self.asset_status(asset_id) == "processing"
        )

    def signed_url(self, asset_id: str, base_url: str | None = None) -> str:
        """A fresh signed file URL (already expired when ``expired_urls`` is set)."""
        asset = self.assets[asset_id]
        base = (base_url or self.public_base_url or "https://cdn.example.invalid").rstrip("/")
        now = int(self.now())
        expired = self.expired_urls or self._roll(self.expired_url_fraction)
        expires = now - 60 if expired else now + max(1, int(self.url_ttl_seconds))
        name = quote(asset.file_name, safe="")
        return f"{base}/files/{name}?expires={expires}&sig={self._sign(asset.file_name, expires)}"

    def job_json(self, job_id: str, base_url: str | None = None) -> dict[str, Any]:
        """The Job object as ``GET /v1/jobs/{id}`` returns it now."""
        job = self.jobs[job_id]
        status = self.job_status(job_id)
        ready = self._ready_at(job)
        urls = (
            {t: self.signed_url(a, base_url) for t, a in job.asset_ids.items()}
            if status == "completed"
            else {}
        )
        data = {
            "id": job.id,
            "status": status,
            "type": job.type,
            "collection_id": job.collection_id,
            "cost_credits": job.cost_credits,
            "created_at": iso(job.created),
            "updated_at": iso(
                ready if ready is not None and status != "processing" else job.created
            ),
            "item_id": job.item_id,
            "item_name": job.item_name,
            "error": job.error if status == "failed" else None,
            "urls": urls,
        }
        return self.shape.apply(
            "job",
            data,
            job.id,
            optional=JOB_OPTIONAL,
            nullable=JOB_NULLABLE,
            optional_nullable=JOB_OPTIONAL_NULLABLE,
        )

    def asset_json(self, asset_id: str, base_url: str | None = None) -> dict[str, Any]:
        """The Asset object as ``GET /v1/assets/{id}`` returns it now (fresh ``file_url``)."""
        asset = self.assets[asset_id]
        status = self.asset_status(asset_id)
        metadata: dict[str, Any] = {"size_bytes": len(asset.data)}
        # metadata is free-form: an upstream may name the job there, or not.
        if self.shape.name == "full" or self.shape.chance(asset.id, "metadata-job", 0.5):
            metadata["job_id"] = asset.job_id
        if asset.content_type == "image/png":
            metadata.update(width=8, height=8)
        else:
            metadata.update(duration_seconds=4)
        # A completed asset always has its signed URL; before that it may be null.
        file_url: str | None = self.signed_url(asset_id, base_url)
        if status != "completed" and (
            self.shape.choice("asset", asset.id, "file_url", nullable=True, optional=False)
            != PRESENT
        ):
            file_url = None
        data = {
            "id": asset.id,
            "type": asset.type,
            "status": status,
            "metadata": metadata,
            "item_id": asset.item_id,
            "collection_id": asset.collection_id,
            "file_url": file_url,
            "cdn_url": f"https://cdn.example.invalid/{asset.collection_id}/{asset.file_name}",
            "is_archived": False,
            "archived_at": None,
            "created_at": iso(asset.created),
        }
        return self.shape.apply(
            "asset",
            data,
            asset.id,
            optional=ASSET_OPTIONAL,
            nullable=ASSET_NULLABLE,
            optional_nullable=ASSET_OPTIONAL_NULLABLE,
        )

    def payload_for(self, job_id: str) -> dict[str, Any]:
        """The webhook body the upstream sends for the job's outcome (same id every time)."""
        job = self.jobs[job_id]
        failed = job.outcome == "failed"
        return self.shape.event_body(
            {
                "id": job.event_id,
                "object": "event",
                "event": "job.failed" if failed else "job.completed",
                "job_id": job.id,
                "type": job.type,
                "mascot_id": job.mascot_id,
                "asset_ids": {} if failed else dict(job.asset_ids),
                "urls": {} if failed else {t: self.signed_url(a) for t, a in job.asset_ids.items()},
                "timestamp": iso(job.finished if job.finished is not None else self.now()),
            }
        )

    # ----------------------------------------------------------------- faults and signing

    def _roll(self, fraction: float) -> bool:
        return fraction > 0 and self.random.random() < fraction

    def _sign(self, file_name: str, expires: int) -> str:
        message = f"{file_name}:{expires}".encode()
        return hmac.new(self._url_key, message, hashlib.sha256).hexdigest()
