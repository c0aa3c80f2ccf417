"""A local stand-in for the upstream service, for the tests and ``receiver simulate``.

:class:`Simulator` holds jobs, assets and webhook subscriptions in memory and serves them with
the upstream's envelopes (``{"data": ...}`` / ``{"error": {"code", "message"}}``)::

    GET    /v1/jobs/{id}[?wait=true&timeout=N]   the job (long-poll until completed/failed)
    GET    /v1/assets/{id}                       the asset with a fresh signed file_url
    POST   /v1/webhooks                          create (the secret is shown once)
    GET    /v1/webhooks                          list (without secrets)
    DELETE /v1/webhooks/{id}                     204
    GET    /files/{asset_id}{ext}?expires=&sig=  the bytes, like a CDN (403 bad/expired signature)

Every ``/v1`` call needs ``Authorization: Bearer <api_key>``. Faults are plain attributes a test
may change at any time (``rate_limit_fraction``, ``error_fraction``, ``latency_seconds`` ...);
the clock (``now``) is injectable and the randomness seeded, so runs are reproducible.

Sending signed webhooks to the subscriptions is :mod:`receiver.simulator_delivery`'s job, and
``receiver simulate`` is put together in :mod:`receiver.simulator_run`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import math
import random
import secrets
import struct
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from aiohttp import web
from aiohttp.typedefs import Middleware

#: The default API key (the spec's format: ``service_`` and 64 hex characters).
DEFAULT_API_KEY = "service_" + "0123456789abcdef" * 4

EVENT_NAMES = ("job.completed", "job.failed")
TERMINAL_STATUSES = frozenset({"completed", "failed"})
#: Formats the upstream derives after the parent job has completed.
DERIVED_TYPES = frozenset({"webm", "hevc", "stacked_video"})
#: Asset type -> (content type, file extension).
MEDIA_TYPES: dict[str, tuple[str, str]] = {
    "image": ("image/png", ".png"),
    "transparent_image": ("image/png", ".png"),
    "sticker_image": ("image/png", ".png"),
    "logo": ("image/png", ".png"),
    "scene": ("image/png", ".png"),
    "video": ("video/mp4", ".mp4"),
    "stacked_video": ("video/mp4", ".mp4"),
    "webm": ("video/webm", ".webm"),
    "hevc": ("video/quicktime", ".mov"),
}
CONTENT_TYPES = {
    ".png": "image/png",
    ".mp4": "video/mp4",
    ".webm": "video/webm",
    ".mov": "video/quicktime",
}


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
_COST_BY_JOB_TYPE = {kind.job_type: kind.cost_credits for kind in KINDS.values()}
_POSES = ("idle", "wave", "jump", "celebrate", "thinking", "sleepy", "surprised", "run")
_LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_MAX_WAIT_SECONDS = 120.0
_DEFAULT_WAIT_SECONDS = 30.0
_TICK = 0.02

_STOPPING_KEY = web.AppKey("simulator_stopping", asyncio.Event)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def iso(ts: float) -> str:
    """A unix time as an ISO 8601 UTC string with milliseconds."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------- media


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data))
        + kind
        + data
        + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def png_bytes(
    width: int = 8,
    height: int = 8,
    *,
    rgb: tuple[int, int, int] = (240, 160, 40),
    transparent: bool = False,
    label: str = "receiver simulator placeholder image",
) -> bytes:
    """A small valid RGBA PNG: a coloured square (with a transparent ring when asked)."""
    rows = []
    for y in range(height):
        row = bytearray(b"\x00")  # filter type 0 (None) for each scanline
        for x in range(width):
            edge = x in (0, width - 1) or y in (0, height - 1)
            alpha = 0 if transparent and edge else 255
            shade = (x + y) * 4
            row += bytes(
                (min(255, rgb[0] + shade), min(255, rgb[1] + shade), min(255, rgb[2]), alpha)
            )
        rows.append(bytes(row))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)  # 8-bit RGBA
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"tEXt", b"Comment\x00" + label.encode("latin-1", "replace"))
        + _png_chunk(b"IDAT", zlib.compress(b"".join(rows), 9))
        + _png_chunk(b"IEND", b"")
    )


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def isobmff_bytes(*, quicktime: bool = False, label: str) -> bytes:
    """Placeholder MP4/MOV bytes: a real ``ftyp`` box, then the label in a ``free`` box.

    Not playable: there is no ``moov``/``mdat``, only enough for content sniffing.
    """
    if quicktime:
        ftyp = b"qt  " + struct.pack(">I", 0x200) + b"qt  "
    else:
        ftyp = b"isom" + struct.pack(">I", 0x200) + b"isomiso2avc1mp41"
    return _box(b"ftyp", ftyp) + _box(b"free", label.encode())


def _ebml(element_id: bytes, payload: bytes) -> bytes:
    size = len(payload)
    size_bytes = bytes([0x80 | size]) if size < 0x7F else b"\x01" + size.to_bytes(7, "big")
    return element_id + size_bytes + payload


def webm_bytes(*, label: str) -> bytes:
    """Placeholder WebM bytes: a real EBML header (DocType ``webm``), then the label in a Void.

    Not playable: there is no Segment.
    """
    header = b"".join(
        (
            _ebml(b"\x42\x86", b"\x01"),  # EBMLVersion
            _ebml(b"\x42\xf7", b"\x01"),  # EBMLReadVersion
            _ebml(b"\x42\xf2", b"\x04"),  # EBMLMaxIDLength
            _ebml(b"\x42\xf3", b"\x08"),  # EBMLMaxSizeLength
            _ebml(b"\x42\x82", b"webm"),  # DocType
            _ebml(b"\x42\x87", b"\x04"),  # DocTypeVersion
            _ebml(b"\x42\x85", b"\x02"),  # DocTypeReadVersion
        )
    )
    return _ebml(b"\x1a\x45\xdf\xa3", header) + _ebml(b"\xec", label.encode())


def media_for(asset_type: str, asset_id: str) -> tuple[str, str, bytes]:
    """(content type, extension, bytes) for an asset; unknown types are treated as images."""
    content_type, ext = MEDIA_TYPES.get(
        asset_type, ("video/mp4", ".mp4") if "video" in asset_type else ("image/png", ".png")
    )
    label = f"receiver simulator placeholder {asset_type} {asset_id}"
    if ext == ".png":
        digest = hashlib.sha256(asset_id.encode()).digest()
        rgb = (digest[0] // 2 + 64, digest[1] // 2 + 64, digest[2] // 2 + 64)
        data = png_bytes(rgb=rgb, transparent=asset_type == "transparent_image", label=label)
    elif ext == ".webm":
        data = webm_bytes(label=label)
    else:
        data = isobmff_bytes(quicktime=ext == ".mov", label=label)
    return content_type, ext, data


# --------------------------------------------------------------------------- state


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


class Simulator:
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
      ``processing``, their files answering 404, until that long after the job completed.
    - ``expired_urls``: file URLs are issued already expired (the file answers 403);
      ``expired_url_fraction``: that fraction of the issued URLs is.

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
    ) -> None:
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
        self.expired_urls = False
        self.expired_url_fraction = 0.0
        self.requests: Counter[str] = Counter()
        self.responses: Counter[tuple[str, int]] = Counter()
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
    ) -> dict[str, Any]:
        """Create a job of ``kind`` (image, animation, logo, scene) and its assets.

        ``status`` is ``completed`` (default), ``failed`` (no assets; ``error`` holds the reason)
        or ``processing`` (until :meth:`complete_job` or :meth:`fail_job`). ``kind="failed"`` is
        short for a failed image job. Returns the webhook payload the upstream sends for it.
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
            item_name=item_name or self.random.choice(_POSES),
            mascot_id=collection_id,
            cost_credits=spec.cost_credits if cost_credits is None else cost_credits,
            created=created,
            finished=None if status == "processing" else created,
            outcome="failed" if status == "failed" else "completed",
            error=(error or "generation failed: the provider returned no image")
            if status == "failed"
            else None,
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
                else _POSES[digest[16] % len(_POSES)],
                mascot_id=mascot_id,
                cost_credits=0 if failed else _COST_BY_JOB_TYPE.get(job_type, 1),
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
        return {
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

    def asset_json(self, asset_id: str, base_url: str | None = None) -> dict[str, Any]:
        """The Asset object as ``GET /v1/assets/{id}`` returns it now (fresh ``file_url``)."""
        asset = self.assets[asset_id]
        metadata: dict[str, Any] = {"job_id": asset.job_id, "size_bytes": len(asset.data)}
        if asset.content_type == "image/png":
            metadata.update(width=8, height=8)
        else:
            metadata.update(duration_seconds=4)
        return {
            "id": asset.id,
            "type": asset.type,
            "status": self.asset_status(asset_id),
            "metadata": metadata,
            "item_id": asset.item_id,
            "collection_id": asset.collection_id,
            "file_url": self.signed_url(asset_id, base_url),
            "cdn_url": None,
            "is_archived": False,
            "archived_at": None,
            "created_at": iso(asset.created),
        }

    def payload_for(self, job_id: str) -> dict[str, Any]:
        """The webhook body the upstream sends for the job's outcome (same id every time)."""
        job = self.jobs[job_id]
        failed = job.outcome == "failed"
        return {
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

    # ----------------------------------------------------------------- HTTP

    def create_app(self) -> web.Application:
        """An aiohttp application serving the API under ``/v1`` and the files under ``/files``."""
        app = web.Application(middlewares=[self._middleware()])
        app[SIMULATOR_KEY] = self
        app[_STOPPING_KEY] = asyncio.Event()

        async def on_shutdown(app: web.Application) -> None:
            app[_STOPPING_KEY].set()  # ends long-polls and latency sleeps at once

        app.on_shutdown.append(on_shutdown)
        app.router.add_get("/v1/jobs/{id}", self._get_job)
        app.router.add_get("/v1/assets/{id}", self._get_asset)
        app.router.add_get("/v1/webhooks", self._list_webhooks)
        app.router.add_post("/v1/webhooks", self._create_webhook)
        app.router.add_delete("/v1/webhooks/{id}", self._delete_webhook)
        app.router.add_get("/files/{name}", self._get_file)
        return app

    def _middleware(self) -> Middleware:
        @web.middleware
        async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else request.path
            key = f"{request.method} {route}"
            self.requests[key] += 1
            if not request.path.startswith("/v1/"):
                response = await handler(request)
            else:
                request_id = f"req_{self.random.getrandbits(64):016x}"
                response = await self._api_call(request, handler, request_id)
                response.headers["Request-Id"] = request_id
            self.responses[key, response.status] += 1
            return response

        return middleware

    async def _api_call(
        self, request: web.Request, handler: Handler, request_id: str
    ) -> web.StreamResponse:
        if self.latency_seconds > 0:
            await _sleep(request.app, self.latency_seconds)
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        # An empty api_key means "accept any credential" (local runs without a key).
        if self.api_key:
            if not header:
                return _error(401, "unauthorized", "Missing API key.", request_id)
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode(), self.api_key.encode()
            ):
                return _error(401, "unauthorized", "Invalid or revoked API key.", request_id)
        if self._roll(self.rate_limit_fraction):
            response = _error(429, "rate_limited", "Too many requests.", request_id)
            if self.retry_after is not None:
                value = self.retry_after
                response.headers["Retry-After"] = (
                    value if isinstance(value, str) else str(math.ceil(value))
                )
            return response
        if self._roll(self.error_fraction):
            status = self.error_status
            code = "internal" if status == 500 else "upstream_error"
            return _error(status, code, "Simulated server error.", request_id)
        if self._roll(self.invalid_json_fraction):
            return web.Response(
                status=200, body=b'{"data": {"id": "trunc', content_type="application/json"
            )
        try:
            return await handler(request)
        except web.HTTPException as exc:  # no route, wrong method
            code = "not_found" if exc.status == 404 else "method_not_allowed"
            return _error(exc.status, code, exc.reason, request_id)

    def _roll(self, fraction: float) -> bool:
        return fraction > 0 and self.random.random() < fraction

    def _base(self, request: web.Request) -> str:
        return self.public_base_url or str(request.url.origin())

    def _sign(self, file_name: str, expires: int) -> str:
        message = f"{file_name}:{expires}".encode()
        return hmac.new(self._url_key, message, hashlib.sha256).hexdigest()

    async def _get_job(self, request: web.Request) -> web.Response:
        job_id = request.match_info["id"]
        if job_id not in self.jobs:
            return _error(404, "not_found", "Job not found.")
        if request.query.get("wait", "").lower() in ("true", "1"):
            raw = request.query.get("timeout", str(_DEFAULT_WAIT_SECONDS))
            try:
                timeout = float(raw)
            except ValueError:
                timeout = -1.0
            if not math.isfinite(timeout) or timeout < 0:
                return _error(
                    400,
                    "validation_failed",
                    "timeout must be a number of seconds.",
                    param="timeout",
                )
            loop = asyncio.get_running_loop()
            deadline = loop.time() + min(timeout, _MAX_WAIT_SECONDS)
            stopping = request.app[_STOPPING_KEY]
            while self.job_status(job_id) not in TERMINAL_STATUSES and not stopping.is_set():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                await asyncio.sleep(min(_TICK, remaining))
        return _data(self.job_json(job_id, self._base(request)))

    async def _get_asset(self, request: web.Request) -> web.Response:
        asset_id = request.match_info["id"]
        if asset_id not in self.assets:
            return _error(404, "not_found", "Asset not found.")
        return _data(self.asset_json(asset_id, self._base(request)))

    async def _get_file(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            expires = int(request.query.get("expires", ""))
        except ValueError:
            return _cdn_error(403, "AccessDenied", "missing or malformed expires")
        sig = request.query.get("sig", "")
        if not hmac.compare_digest(sig.encode(), self._sign(name, expires).encode()):
            return _cdn_error(403, "AccessDenied", "signature does not match")
        if self.now() >= expires:
            return _cdn_error(403, "AccessDenied", "request has expired")
        asset_id = self._files.get(name)
        if asset_id is None or self.asset_status(asset_id) != "completed":
            return _cdn_error(404, "NoSuchKey", "the file does not exist yet")
        asset = self.assets[asset_id]
        return web.Response(
            body=asset.data,
            content_type=asset.content_type,
            headers={"Cache-Control": "private, max-age=60"},
        )

    async def _list_webhooks(self, request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "50"))
            offset = int(request.query.get("offset", "0"))
        except ValueError:
            limit = offset = -1
        if not 1 <= limit <= 100 or offset < 0:
            return _error(400, "validation_failed", "limit is 1 to 100 and offset >= 0.")
        hooks = list(self.webhooks.values())
        page = hooks[offset : offset + limit]
        meta = {
            "pagination": {
                "total": len(hooks),
                "limit": limit,
                "offset": offset,
                "has_more": offset + len(page) < len(hooks),
            }
        }
        return _data([hook.as_json() for hook in page], meta=meta)

    async def _create_webhook(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "validation_failed", "The body is not JSON.")
        if not isinstance(body, dict):
            return _error(400, "validation_failed", "The body must be a JSON object.")
        url = body.get("url")
        if not isinstance(url, str) or not _acceptable_webhook_url(url):
            return _error(
                400,
                "validation_failed",
                "url must be an https URL (or http on localhost).",
                param="url",
            )
        events = body.get("events")
        if events is None:
            events = list(EVENT_NAMES)
        elif (
            not isinstance(events, list)
            or not events
            or not all(isinstance(e, str) and e in EVENT_NAMES for e in events)
        ):
            return _error(
                400,
                "validation_failed",
                f"events must be a non-empty subset of {list(EVENT_NAMES)}.",
                param="events",
            )
        hook = self.add_webhook(url, events)
        return _data(hook.as_json(with_secret=True), status=201)

    async def _delete_webhook(self, request: web.Request) -> web.Response:
        if self.webhooks.pop(request.match_info["id"], None) is None:
            return _error(404, "not_found", "Webhook not found.")
        return web.Response(status=204)


SIMULATOR_KEY = web.AppKey("simulator", Simulator)


def _acceptable_webhook_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return False
    if not host:
        return False
    return parts.scheme == "https" or (parts.scheme == "http" and host in _LOCAL_HOSTS)


async def _sleep(app: web.Application, seconds: float) -> None:
    """Sleep, but stop early when the application shuts down."""
    stopping = app[_STOPPING_KEY]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not stopping.is_set():
        remaining = deadline - loop.time()
        if remaining <= 0:
            return
        await asyncio.sleep(min(_TICK * 5, remaining))


def _data(data: Any, *, status: int = 200, meta: dict[str, Any] | None = None) -> web.Response:
    body: dict[str, Any] = {"data": data}
    if meta is not None:
        body["meta"] = meta
    return web.json_response(body, status=status)


def _error(
    status: int,
    code: str,
    message: str,
    request_id: str | None = None,
    *,
    param: str | None = None,
) -> web.Response:
    error: dict[str, Any] = {"code": code, "message": message}
    if param is not None:
        error["param"] = param
    if request_id is not None:
        error["request_id"] = request_id
    return web.json_response({"error": error}, status=status)


def _cdn_error(status: int, code: str, message: str) -> web.Response:
    """A CDN-style refusal: XML like S3/CloudFront, not the API's envelope."""
    body = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
    return web.Response(status=status, text=body, content_type="application/xml")
