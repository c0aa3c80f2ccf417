"""Reconcile a collection: deliver the completed assets that no sink has delivered yet.

A run pages through ``GET /collections/{id}/assets`` (100 a page, following
``meta.pagination``), groups the assets by the job that made them (``metadata.job_id``) and
judges each job:

- **not ready** while any of its assets is not ``completed`` (derived formats finish after the
  parent job; the job is delivered whole, by a later run);
- **already delivered** when the inbox's job-outcome ledger holds its ``job.completed`` (by
  webhook, poll or an earlier reconcile, even after the event itself was pruned), or when a
  download sink already holds every one of its files;
- otherwise **newly delivered**: a ``job.completed`` event naming those assets in ``asset_ids``
  (see :mod:`receiver.pull.events`) goes into the inbox, and the workers of the running
  receiver hand it to every sink through the normal lanes.

Assets archived, older than ``since``, or without a job reference are counted as skipped. The
run only adds events, with ids stable per job, so it is safe while the receiver serves and a
second run delivers nothing new. 429 and other transient upstream answers are retried with the
worker's backoff, or after the upstream's ``Retry-After`` when longer.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from receiver.config import ReconcileSettings, Settings
from receiver.errors import ReceiverError, TransientError
from receiver.logs import get_logger
from receiver.metrics import Metrics
from receiver.pull.events import outcome_event
from receiver.retry import RetryPolicy
from receiver.sinks.download import DEFAULT_DIRECTORY, has_file
from receiver.store.base import Store
from receiver.store.pull import outcome_key

log = get_logger("receiver.pull.reconcile")

ASSET_READY = "completed"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class AssetPages(Protocol):
    """What a reconcile run needs from the upstream client."""

    async def collection_assets_page(
        self, collection_id: str, *, offset: int = 0, limit: int = 100
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]: ...


@dataclass
class ReconcileSummary:
    """What one run found; counts are of assets (``events`` counts the events it stored)."""

    collection_id: str
    dry_run: bool = False
    pages: int = 0
    seen: int = 0
    already_delivered: int = 0
    newly_delivered: int = 0
    not_ready: int = 0
    skipped: int = 0
    events: int = 0
    retries: int = 0
    total: int | None = None

    def line(self) -> str:
        new = "to deliver" if self.dry_run else "newly delivered"
        text = (
            f"collection {self.collection_id}: seen {self.seen}, already delivered "
            f"{self.already_delivered}, {new} {self.newly_delivered}, not ready {self.not_ready}"
        )
        if self.skipped:
            text += f", skipped {self.skipped}"
        return text + (" (dry run: nothing stored)" if self.dry_run else "")


@dataclass
class _Job:
    collection_id: str | None
    assets: dict[str, str] = field(default_factory=dict)  # key -> asset id
    types: dict[str, str] = field(default_factory=dict)  # key -> asset type
    ready: bool = True


def parse_since(value: str, *, now: float) -> float:
    """``--since``: an ISO 8601 date or time (UTC unless it says), or an age such as ``48h``,
    ``7d``, ``30m``; the unix time it names. ValueError for anything else."""
    text = value.strip()
    match = _DURATION.fullmatch(text)
    if match:
        return now - float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _created(asset: Mapping[str, Any]) -> float | None:
    value = asset.get("created_at")
    if not isinstance(value, str):
        return None
    try:
        return parse_since(value, now=0.0)
    except ValueError:
        return None


def _job_id(asset: Mapping[str, Any]) -> str | None:
    metadata = asset.get("metadata")
    value = metadata.get("job_id") if isinstance(metadata, dict) else None
    value = value or asset.get("job_id")
    return value if isinstance(value, str) and value else None


class Reconciler:
    """Runs reconciles against one store and upstream (see the module docstring).

    ``sleep`` waits between retries of a page (tests may shorten it).
    """

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        upstream: AssetPages,
        metrics: Metrics | None = None,
        on_event: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._settings = settings
        self._store = store
        self._upstream = upstream
        self._metrics = metrics
        self._on_event = on_event
        self._clock = clock
        self._sleep = sleep
        self._policy = RetryPolicy.for_worker(settings.worker)
        self._download_dirs = [
            Path(str(s.options.get("directory") or DEFAULT_DIRECTORY))
            for s in settings.sinks
            if s.type == "download"
        ]

    async def run(
        self,
        collection_id: str,
        *,
        since: float | None = None,
        dry_run: bool = False,
        progress: Callable[[ReconcileSummary], None] | None = None,
    ) -> ReconcileSummary:
        """One pass over the collection; the summary. Raises ReceiverError when a page cannot
        be fetched (after retries) or the store cannot be used."""
        summary = ReconcileSummary(collection_id, dry_run=dry_run)
        jobs: dict[str, _Job] = {}
        offset = 0
        while True:
            page, pagination = await self._page(collection_id, offset, summary)
            summary.pages += 1
            total = pagination.get("total")
            summary.total = total if isinstance(total, int) else None
            for asset in page:
                self._sort(asset, jobs, summary, since)
            if progress is not None:
                progress(summary)
            limit = pagination.get("limit")
            if pagination.get("has_more") is not True or not page or not isinstance(limit, int):
                break
            offset = int(pagination.get("offset", offset)) + limit
        await self._deliver(jobs, summary, dry_run)
        return summary

    async def _page(
        self, collection_id: str, offset: int, summary: ReconcileSummary
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        attempts = 0
        while True:
            try:
                return await self._upstream.collection_assets_page(collection_id, offset=offset)
            except TransientError as exc:
                attempts += 1
                decision = self._policy.decide(exc, attempts)
                if decision.dead:
                    raise
                log.warning(
                    "collection page not fetched; will retry",
                    collection_id=collection_id,
                    offset=offset,
                    error=exc.message,
                    retry_in=round(decision.delay, 2),
                )
                summary.retries += 1
                await self._sleep(decision.delay)

    def _sort(
        self,
        asset: Mapping[str, Any],
        jobs: dict[str, _Job],
        summary: ReconcileSummary,
        since: float | None,
    ) -> None:
        summary.seen += 1
        job_id = _job_id(asset)
        created = _created(asset)
        old = since is not None and (created is None or created < since)
        if job_id is None or asset.get("is_archived") is True or old:
            summary.skipped += 1
            return
        collection = asset.get("collection_id")
        job = jobs.setdefault(job_id, _Job(collection if isinstance(collection, str) else None))
        asset_type = str(asset.get("type") or "asset")
        key, n = asset_type, 1
        while key in job.assets:
            n += 1
            key = f"{asset_type}_{n}"
        job.assets[key] = str(asset.get("id"))
        job.types[key] = asset_type
        if asset.get("status") != ASSET_READY:
            job.ready = False

    async def _deliver(self, jobs: dict[str, _Job], summary: ReconcileSummary, dry: bool) -> None:
        known = await self._store.known_outcomes(
            [key for job_id in jobs if (key := outcome_key("job.completed", job_id))]
        )
        for job_id, job in jobs.items():
            count = len(job.assets)
            if not job.ready:
                summary.not_ready += count
            elif outcome_key("job.completed", job_id) in known or await asyncio.to_thread(
                self._on_disk, job
            ):
                summary.already_delivered += count
            elif dry:
                summary.newly_delivered += count
            elif await self._store.add_event(
                outcome_event(
                    self._settings,
                    source="reconcile",
                    event="job.completed",
                    job_id=job_id,
                    now=self._clock(),
                    asset_ids=job.assets,
                )
            ):
                summary.newly_delivered += count
                summary.events += 1
                if self._metrics is not None:
                    self._metrics.pull_events.labels("reconcile").inc()
                    self._metrics.events.labels("job.completed", "received").inc()
            else:  # stored meanwhile by a webhook, a poll or another run
                summary.already_delivered += count
        if summary.events:
            self._on_event()

    def _on_disk(self, job: _Job) -> bool:
        """Whether a download sink already holds every file of the job."""
        return any(
            all(
                has_file(root, job.collection_id, job.types[key], asset_id)
                for key, asset_id in job.assets.items()
            )
            for root in self._download_dirs
        )


async def reconcile_periodically(reconciler: Reconciler, config: ReconcileSettings) -> None:
    """Reconcile ``config.collection_id`` now and every ``interval_minutes``, until cancelled.

    A failed run is logged and tried again at the next interval; it never stops the receiver.
    """
    while True:
        try:
            summary = await reconciler.run(config.collection_id)
        except ReceiverError as exc:
            log.warning("reconcile failed", collection_id=config.collection_id, error=exc.message)
        else:
            log.info(
                "reconciled",
                collection_id=config.collection_id,
                seen=summary.seen,
                already_delivered=summary.already_delivered,
                newly_delivered=summary.newly_delivered,
                not_ready=summary.not_ready,
                skipped=summary.skipped,
            )
        await asyncio.sleep(config.interval_minutes * 60)
