"""The upstream service's state in memory: jobs, assets, signed file URLs and subscriptions.

:class:`SimulatorState` builds jobs (``add_job``, ``adopt`` ...) and answers what the upstream's
API would show for them now (``job_json``, ``asset_json``, ``payload_for``), on an injectable
clock and a seeded random source. :class:`receiver.simulator.api.Simulator` serves it over HTTP.
"""

from __future__ import annotations

import hashlib
import json
import random
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from receiver.simulator.media import media_for
from receiver.simulator.model import (
    COST_BY_JOB_TYPE,
    DEFAULT_API_KEY,
    EVENT_NAMES,
    KINDS,
    POSES,
    SimAsset,
    SimJob,
    SimWebhook,
)
from receiver.simulator.pulling import PullingState
from receiver.simulator.shape import (
    DEFAULT_SHAPE,
    Shape,
    ShapeName,
)
from receiver.simulator.views import SimulatorViews


class SimulatorState(SimulatorViews, PullingState):
    """The upstream service in memory: jobs, assets, files and webhook subscriptions.

    Fault knobs (plain attributes, read on every request):

    - ``rate_limit_fraction``: that fraction of API calls answers 429 ``rate_limited``, with a
      ``Retry-After`` header when ``retry_after`` is set (seconds, or a string sent verbatim
      such as an HTTP date).
    - ``error_fraction``: that fraction answers ``error_status`` (default 500).
    - ``invalid_json_fraction``: that fraction answers 200 with a truncated JSON body.
    - ``latency_seconds``: added to every API call (not to file downloads).
    - ``job_pending_for_seconds``: a job reports ``processing`` until that long after creation.
    - ``derived_delay_seconds``: derived formats (webm, hevc, stacked_video) stay
      ``processing``, their files answering 404, until that long after the job completed;
      with ``derived_missing`` they do not exist until then: ``GET /v1/assets/{id}`` answers
      404 (the spec: "a completed parent does not guarantee every derived asset exists").
    - ``expired_urls``: file URLs are issued already expired (the file answers 403);
      ``expired_url_fraction``: that fraction of the issued URLs is.
    - ``no_webhook_fraction`` and 429 bursts: see :mod:`receiver.simulator.pulling`.

    ``requests`` counts calls by ``"METHOD /route/{template}"`` (for example
    ``"GET /v1/jobs/{id}"``, ``"GET /files/{name}"``), including refused ones; ``responses``
    counts them by ``(route, status)``.
    """

    def __init__(
        self,
        *,
        api_key: str = DEFAULT_API_KEY,
        public_base_url: str | None = None,
        seed: int = 0,
        now: Callable[[], float] = time.time,
        url_ttl_seconds: float = 3600.0,
        shape: ShapeName = DEFAULT_SHAPE,
    ) -> None:
        super().__init__()
        #: Which optional fields each object carries (see :mod:`receiver.simulator.shape`).
        self.shape = Shape(shape, seed=seed)
        self.api_key = api_key
        #: Origin used in file URLs; ``None`` uses the origin each request arrived on.
        self.public_base_url = public_base_url.rstrip("/") if public_base_url else None
        #: Where the API is served (``.../v1``), recorded by whoever starts the server.
        self.base_url: str | None = None
        self.now = now
        self.random = random.Random(seed)
        self.url_ttl_seconds = url_ttl_seconds
        self.rate_limit_fraction = 0.0
        self.retry_after: str | float | None = None
        self.error_fraction = 0.0
        self.error_status = 500
        self.invalid_json_fraction = 0.0
        self.latency_seconds = 0.0
        self.job_pending_for_seconds = 0.0
        self.derived_delay_seconds = 0.0
        self.derived_missing = False
        self.expired_urls = False
        self.expired_url_fraction = 0.0
        self.requests: Counter[str] = Counter()
        self.responses: Counter[tuple[str, int]] = Counter()
        #: What a receiver has fetched: ``job:{id}`` once finished, ``asset:{id}`` once
        #: completed; and when the last request of any kind ended (``time.monotonic()``).
        self.fetched: set[str] = set()
        self.last_request_at = 0.0
        self.jobs: dict[str, SimJob] = {}
        self.assets: dict[str, SimAsset] = {}
        self.webhooks: dict[str, SimWebhook] = {}
        self._files: dict[str, str] = {}
        self._url_key = secrets.token_bytes(32)

    # ----------------------------------------------------------------- building state

    def new_id(self) -> str:
        """A UUID4 string from the seeded generator."""
        return str(uuid.UUID(int=self.random.getrandbits(128), version=4))

    def add_job(
        self,
        kind: str = "image",
        *,
        status: str = "completed",
        error: str | None = None,
        job_id: str | None = None,
        event_id: str | None = None,
        collection_id: str | None = None,
        item_id: str | None = None,
        item_name: str | None = None,
        cost_credits: float | None = None,
        webhook: bool | None = None,
    ) -> dict[str, Any]:
        """Create a job of ``kind`` (image, animation, logo, scene) and its assets.

        ``status`` is ``completed`` (default), ``failed`` (no assets; ``error`` holds the reason)
        or ``processing`` (until :meth:`complete_job` or :meth:`fail_job`). ``kind="failed"`` is
        short for a failed image job. ``webhook=False`` makes a job the upstream sends no
        webhook for (default: ``no_webhook_fraction`` decides). Returns the webhook payload the
        upstream would send for it.
        """
        if kind == "failed":
            kind, status = "image", "failed"
        if kind not in KINDS:
            raise ValueError(f"unknown job kind {kind!r}; expected one of {sorted(KINDS)}")
        if status not in ("completed", "failed", "processing"):
            raise ValueError(f"unknown job status {status!r}")
        spec = KINDS[kind]
        collection_id = collection_id or self.new_id()
        created = self.now()
        job = SimJob(
            id=job_id or self.new_id(),
            type=spec.job_type,
            event_id=event_id or self.new_id(),
            collection_id=collection_id,
            item_id=item_id or self.new_id(),
            item_name=item_name or self.random.choice(POSES),
            mascot_id=collection_id,
            cost_credits=spec.cost_credits if cost_credits is None else cost_credits,
            created=created,
            finished=None if status == "processing" else created,
            outcome="failed" if status == "failed" else "completed",
            error=(error or "generation failed: the provider returned no image")
            if status == "failed"
            else None,
            sends_webhook=not self._roll(self.no_webhook_fraction) if webhook is None else webhook,
        )
        if status == "failed" and cost_credits is None:
            job.cost_credits = 0  # refunded
        self.jobs[job.id] = job
        if status != "failed":
            for asset_type in spec.asset_types:
                self._add_asset(job, asset_type, self.new_id())
        return self.payload_for(job.id)

    def add_failed_job(
        self, kind: str = "image", *, error: str = "generation failed", **kwargs: Any
    ) -> dict[str, Any]:
        """A failed job of ``kind`` (see :meth:`add_job`); returns its ``job.failed`` payload."""
        return self.add_job(kind, status="failed", error=error, **kwargs)

    def complete_job(self, job_id: str) -> dict[str, Any]:
        """Mark a held job completed now; returns its ``job.completed`` payload."""
        job = self.jobs[job_id]
        job.outcome, job.error, job.finished = "completed", None, self.now()
        return self.payload_for(job_id)

    def fail_job(self, job_id: str, error: str = "generation failed") -> dict[str, Any]:
        """Mark a job failed now; returns its ``job.failed`` payload."""
        job = self.jobs[job_id]
        job.outcome, job.error, job.finished = "failed", error, self.now()
        return self.payload_for(job_id)

    def add_webhook(
        self, url: str, events: list[str] | None = None, *, secret: str | None = None
    ) -> SimWebhook:
        """Subscribe ``url`` to ``events`` (default all), with ``secret`` or a new random one.

        ``POST /v1/webhooks`` comes here after validating the request; ``receiver simulate
        --target URL --secret S`` calls it directly for its ad-hoc subscription.
        """
        hook = SimWebhook(
            id=f"wh_{self.random.getrandbits(96):024x}",
            url=url,
            events=list(dict.fromkeys(events or EVENT_NAMES)),
            secret=secret or "whsec_" + secrets.token_hex(24),
            created=self.now(),
        )
        self.webhooks[hook.id] = hook
        return hook

    def adopt(self, payload: Mapping[str, Any]) -> str:
        """Create the job and assets an arbitrary webhook payload refers to; returns the job id.

        The job gets the payload's id, type and mascot; each ``asset_ids`` entry becomes an
        asset of that type with placeholder media. ``job.failed`` payloads give a failed job.
        Assets already known are kept; an existing job is updated, not duplicated.
        """
        job_id = payload.get("job_id")
        if not isinstance(job_id, str) or not job_id:
            raise ValueError("payload has no job_id")
        failed = payload.get("event") == "job.failed"
        job_type = payload.get("type")
        job_type = job_type if isinstance(job_type, str) and job_type else "image_generation"
        mascot_id = payload.get("mascot_id")
        mascot_id = mascot_id if isinstance(mascot_id, str) else None
        event_id = payload.get("id")
        job = self.jobs.get(job_id)
        if job is None:
            digest = hashlib.sha256(job_id.encode()).digest()
            item_name = payload.get("item_name")
            error = payload.get("error")
            created = self.now()
            job = SimJob(
                id=job_id,
                type=job_type,
                event_id=event_id if isinstance(event_id, str) else self.new_id(),
                collection_id=mascot_id,
                item_id=str(uuid.UUID(bytes=digest[:16], version=4)),
                item_name=item_name
                if isinstance(item_name, str)
                else POSES[digest[16] % len(POSES)],
                mascot_id=mascot_id,
                cost_credits=0 if failed else COST_BY_JOB_TYPE.get(job_type, 1),
                created=created,
                finished=created,
                outcome="failed" if failed else "completed",
                error=(error if isinstance(error, str) else "generation failed")
                if failed
                else None,
            )
            self.jobs[job_id] = job
        asset_ids = payload.get("asset_ids")
        if isinstance(asset_ids, Mapping):
            for asset_type, asset_id in asset_ids.items():
                if not isinstance(asset_type, str) or not isinstance(asset_id, str):
                    continue
                if asset_id in self.assets:
                    job.asset_ids.setdefault(asset_type, asset_id)
                else:
                    self._add_asset(job, asset_type, asset_id)
        return job_id

    def load_examples(self, directory: str | Path) -> list[dict[str, Any]]:
        """Adopt every ``*.json`` payload in ``directory`` (sorted); returns the payloads."""
        payloads = []
        for path in sorted(Path(directory).glob("*.json")):
            payload = json.loads(path.read_text(encoding="utf-8"))
            self.adopt(payload)
            payloads.append(payload)
        return payloads

    def _add_asset(self, job: SimJob, asset_type: str, asset_id: str) -> SimAsset:
        content_type, ext, data = media_for(asset_type, asset_id)
        asset = SimAsset(
            id=asset_id,
            type=asset_type,
            job_id=job.id,
            item_id=job.item_id,
            collection_id=job.collection_id,
            content_type=content_type,
            ext=ext,
            data=data,
            created=job.created,
        )
        self.assets[asset_id] = asset
        self._files[asset.file_name] = asset_id
        job.asset_ids[asset_type] = asset_id
        return asset
