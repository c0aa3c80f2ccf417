"""Reconcile a collection: deliver each completed asset that no event has delivered yet.

A run pages through ``GET /collections/{id}/assets`` (following ``meta.pagination``, whatever
page size the upstream answers with) and judges every asset on its own, from what the upstream
guarantees for an asset (its ``id``, ``type``, ``status``, ``item_id`` and ``created_at``; the
free-form ``metadata`` may be null):

- **skipped**, with the reason: archived, created before ``--since``, created before the time
  up to which the asset ledger has forgotten rows (``[store].ledger_retention_days``: whether
  it was delivered is no longer known, and delivering it again could send it twice), or
  unreadable (no id or no type: it cannot be judged);
- **not ready** while its ``status`` is not ``completed`` (a later run takes it);
- **already delivered** when the asset ledger (:mod:`receiver.store.asset_ledger`) says an event
  took it: by its asset id (a webhook, a poll or an earlier run named it), or by the job's or
  the item's file of its type or the file's address (an event that used the job's ``urls``),
  or when a download sink already holds its file;
- **waiting** when the job that made it has an outcome in the inbox whose job is not fetched
  yet (that event will deliver it);
- otherwise **newly delivered**: it goes into a ``job.completed`` event (see
  :mod:`receiver.pull.events`) with the other missing assets of its *unit*, and the workers of
  the running receiver hand it to every sink through the normal lanes.

The unit is the job when the asset names one (``metadata.job_id``, which some upstreams give),
else the item (``item_id``), else the asset alone. The run only adds events, with ids stable per
unit and set of assets, so it is safe while the receiver serves and a second run delivers
nothing new. 429 and other transient upstream answers are retried with the worker's backoff, or
after the upstream's ``Retry-After`` when longer.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from receiver.config.settings import ReconcileSettings, Settings
from receiver.errors import ReceiverError, TransientError
from receiver.logs import get_logger
from receiver.observe.metrics import Metrics
from receiver.pull.events import reconcile_event, unit_job_id
from receiver.retry import RetryPolicy
from receiver.sinks.download import DEFAULT_DIRECTORY, has_file
from receiver.store.asset_ledger import (
    FORGOTTEN_BEFORE,
    asset_key,
    item_type_key,
    job_key,
    job_type_key,
    upstream_time,
    url_key,
)
from receiver.store.base import Store
from receiver.store.pull import outcome_key

log = get_logger("receiver.pull.reconcile")

ASSET_READY = "completed"
Unit = Literal["job", "item", "asset"]


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
    waiting: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    events: int = 0
    retries: int = 0
    total: int | None = None

    @property
    def unjudged(self) -> int:
        """Assets that could not be judged at all (no id or no type)."""
        return self.skipped["unreadable"]

    @property
    def failed(self) -> bool:
        """A run that saw assets and could judge none of them: something is wrong upstream."""
        return self.seen > 0 and self.unjudged == self.seen

    def line(self) -> str:
        new = "to deliver" if self.dry_run else "newly delivered"
        text = (
            f"collection {self.collection_id}: seen {self.seen}, already delivered "
            f"{self.already_delivered}, {new} {self.newly_delivered}, not ready {self.not_ready}"
        )
        if self.waiting:
            text += f", waiting for the inbox {self.waiting}"
        if self.skipped:
            reasons = ", ".join(f"{why} {n}" for why, n in sorted(self.skipped.items()))
            text += f", skipped {sum(self.skipped.values())} ({reasons})"
        return text + (" (dry run: nothing stored)" if self.dry_run else "")


@dataclass(frozen=True)
class _Asset:
    id: str
    type: str
    ready: bool
    item_id: str | None
    created: float | None
    where: str | None  # the url key of its file_url


@dataclass
class _Unit:
    kind: Unit
    ident: str
    assets: list[_Asset] = field(default_factory=list)

    @property
    def job_id(self) -> str:
        """The job id its event carries: the job's own, or one made for the item or asset."""
        return self.ident if self.kind == "job" else unit_job_id(self.kind, self.ident)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _job_reference(asset: Mapping[str, Any]) -> str | None:
    """The job an asset names, when the upstream gives one (``metadata`` is free-form)."""
    metadata = asset.get("metadata")
    found = metadata.get("job_id") if isinstance(metadata, dict) else None
    return _text(found) or _text(asset.get("job_id"))


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
        # An asset created before the ledger forgot rows up to may have been delivered and
        # forgotten since (receiver.store.asset_ledger).
        horizon = (await self._store.ledger([FORGOTTEN_BEFORE])).get(FORGOTTEN_BEFORE)
        units: dict[tuple[Unit, str], _Unit] = {}
        offset = 0
        while True:
            page, pagination = await self._page(collection_id, offset, summary)
            summary.pages += 1
            total = pagination.get("total")
            summary.total = total if isinstance(total, int) else None
            for asset in page:
                self._sort(asset, units, summary, since, horizon)
            if progress is not None:
                progress(summary)
            limit = pagination.get("limit")
            if pagination.get("has_more") is not True or not page or not isinstance(limit, int):
                break
            following = int(pagination.get("offset", offset)) + limit
            if following <= offset:  # an answer that would page forever (the spec: limit > 0)
                raise ReceiverError(
                    f"collection {collection_id}: the page at offset {offset} points back to "
                    f"offset {following}"
                )
            offset = following
        await self._deliver(collection_id, list(units.values()), summary, dry_run)
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
        units: dict[tuple[Unit, str], _Unit],
        summary: ReconcileSummary,
        since: float | None,
        horizon: float | None = None,
    ) -> None:
        summary.seen += 1
        ident, kind = _text(asset.get("id")), _text(asset.get("type"))
        created = upstream_time(asset.get("created_at"))
        if ident is None or kind is None:
            summary.skipped["unreadable"] += 1
            return
        if asset.get("is_archived") is True:
            summary.skipped["archived"] += 1
            return
        if since is not None and (created is None or created < since):
            summary.skipped["before --since"] += 1
            return
        if horizon is not None and created is not None and created < horizon:
            summary.skipped["before the ledger's retention"] += 1
            return
        item_id = _text(asset.get("item_id"))
        job_id = _job_reference(asset)
        unit: tuple[Unit, str] = (
            ("job", job_id) if job_id else ("item", item_id) if item_id else ("asset", ident)
        )
        ready = asset.get("status") == ASSET_READY
        units.setdefault(unit, _Unit(*unit)).assets.append(
            _Asset(ident, kind, ready, item_id, created, url_key(asset.get("file_url")))
        )

    async def _deliver(
        self, collection_id: str, units: list[_Unit], summary: ReconcileSummary, dry: bool
    ) -> None:
        keys: list[str] = []
        for unit in units:
            keys.append(job_key(unit.job_id))
            for a in unit.assets:
                keys += [asset_key(a.id), job_type_key(unit.job_id, a.type)]
                if a.item_id:
                    keys.append(item_type_key(a.item_id, a.type))
                if a.where:
                    keys.append(a.where)
        ledger = await self._store.ledger(list(dict.fromkeys(keys)))
        held = await self._store.known_outcomes(
            [k for u in units if (k := outcome_key("job.completed", u.job_id))]
        )
        for unit in units:
            missing = await self._judge(collection_id, unit, ledger, held, summary)
            if not missing:
                continue
            if dry:
                summary.newly_delivered += len(missing)
                continue
            event = reconcile_event(
                self._settings,
                unit=unit.kind,
                job_id=unit.job_id,
                collection_id=collection_id,
                item_id=unit.ident if unit.kind == "item" else None,
                assets=[(a.type, a.id) for a in missing],
                now=self._clock(),
            )
            if await self._store.add_event(event):
                summary.newly_delivered += len(missing)
                summary.events += 1
                if self._metrics is not None:
                    self._metrics.pull_events.labels("reconcile").inc()
                    self._metrics.events.labels("job.completed", "received").inc()
            else:  # the same assets stored meanwhile by another run
                summary.already_delivered += len(missing)
        if summary.events:
            self._on_event()

    async def _judge(
        self,
        collection_id: str,
        unit: _Unit,
        ledger: Mapping[str, float | None],
        held: set[str],
        summary: ReconcileSummary,
    ) -> list[_Asset]:
        """Count each asset of ``unit``; the completed ones no event has taken."""
        pending = outcome_key("job.completed", unit.job_id) in held and (
            job_key(unit.job_id) not in ledger
        )
        missing = []
        for a in unit.assets:
            if not a.ready:
                summary.not_ready += 1
            elif self._taken(unit, a, ledger) or await asyncio.to_thread(
                self._on_disk, collection_id, a
            ):
                summary.already_delivered += 1
            elif pending:
                summary.waiting += 1
            else:
                missing.append(a)
        return missing

    @staticmethod
    def _taken(unit: _Unit, a: _Asset, ledger: Mapping[str, float | None]) -> bool:
        if asset_key(a.id) in ledger or job_type_key(unit.job_id, a.type) in ledger:
            return True
        if a.where is not None and a.where in ledger:
            return True
        if a.item_id is None:
            return False
        key = item_type_key(a.item_id, a.type)
        if key not in ledger:
            return False
        taken_at = ledger[key]
        return a.created is None or taken_at is None or a.created <= taken_at

    def _on_disk(self, collection_id: str, a: _Asset) -> bool:
        """Whether a download sink already holds this asset's file."""
        return any(has_file(root, collection_id, a.type, a.id) for root in self._download_dirs)


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
            log.log(
                40 if summary.failed else 20,
                "reconciled",
                collection_id=config.collection_id,
                seen=summary.seen,
                already_delivered=summary.already_delivered,
                newly_delivered=summary.newly_delivered,
                not_ready=summary.not_ready,
                waiting=summary.waiting,
                skipped=dict(summary.skipped),
            )
        await asyncio.sleep(config.interval_minutes * 60)
