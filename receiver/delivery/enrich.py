"""Turning a stored webhook into the enriched event: the fresh job and its fresh assets.

The webhook body is only a hint. The job is fetched again, and for ``job.completed`` each asset
named in the event's ``asset_ids`` is fetched for its current status and a fresh signed
``file_url`` (the URLs in the webhook may have expired). Only when the event names no asset ids
are the fresh job's ``urls`` used. Anything not finished yet raises :class:`NotReady`, so the
event is tried again later instead of skipping a file.

Only the spec's four job statuses are acted on: ``pending`` and ``processing`` wait,
``completed`` and ``failed`` are finished. Any other status (one the upstream added, or none) is
not taken as finished: the event waits like an unfinished one, retried with backoff until the
status is one of the four, dead (and redeliverable) after ``worker.max_attempts``. (The API
client counts such a job in ``receiver_upstream_invalid_total{object="job",field="status"}``,
see :mod:`receiver.upstream.conformance`.) An asset is ready only when its status is
``completed``: whatever else it says, the event waits. An asset the event names that the
upstream answers 404 for waits the same way: "derived formats can finish after the parent job,
so a completed parent does not guarantee every derived asset exists" (the spec's States), so
only ``worker.max_attempts`` ends it dead.

What is fetched is a :class:`~receiver.store.records.Snapshot`, stored with the event once and
shared by all of its deliveries (:meth:`Enricher.fetch`); :meth:`Enricher.build` turns a record
and its snapshot into the :class:`Enriched` event the sinks get, without any upstream call.
:meth:`Enricher.refresh` fetches again only what went stale: the assets whose signed URLs were
refused, or everything once the snapshot is older than ``worker.job_max_age_seconds``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Protocol

from receiver.errors import NotReady, PermanentError, TransientError
from receiver.events import Enriched, FileRef
from receiver.logs import get_logger
from receiver.pull.events import unit_job_id
from receiver.store.records import EventRecord, Snapshot
from receiver.upstream.reads import JOB_STATUSES

log = get_logger("receiver.enrich")

UNFINISHED_JOB_STATES = frozenset({"pending", "processing"})
ASSET_READY = "completed"
#: The ``job`` of a reconciled event whose assets name no job: nothing to fetch, and only
#: completed assets are ever named (see :mod:`receiver.pull.events`).
JOBLESS: Mapping[str, Any] = {"status": "completed"}
#: ``reconcile_unit`` values of events made for assets that name no job.
JOBLESS_UNITS = frozenset({"item", "asset"})


def without_job(payload: Mapping[str, Any]) -> bool:
    """Whether a stored event was made by reconcile for assets that name no job: its job id is
    the one reconcile makes for its item or asset (a webhook cannot pass for one by its fields
    alone)."""
    unit = payload.get("reconcile_unit")
    if payload.get("source") != "reconcile" or unit not in JOBLESS_UNITS:
        return False
    asset_ids = payload.get("asset_ids")
    ident = (
        payload.get("item_id")
        if unit == "item"
        else next(iter(asset_ids.values()), None)
        if isinstance(asset_ids, dict) and len(asset_ids) == 1
        else None
    )
    return isinstance(ident, str) and payload.get("job_id") == unit_job_id(unit, ident)


class JobSource(Protocol):
    """What enrichment needs from the upstream API client."""

    async def get_job(self, job_id: str) -> dict[str, Any]: ...

    async def get_asset(self, asset_id: str) -> dict[str, Any]: ...


class Enricher:
    """Fetches snapshots for stored events from the upstream API and builds :class:`Enriched`
    events from them."""

    def __init__(self, upstream: JobSource, *, clock: Callable[[], float]) -> None:
        self._upstream = upstream
        self._clock = clock

    async def fetch(self, record: EventRecord) -> Snapshot:
        """The fresh job (and assets) for a stored event; raise DeliveryError if not ready."""
        started = self._clock()
        payload = record.payload()
        if without_job(payload):
            job: dict[str, Any] = dict(JOBLESS)
        else:
            job = await self._upstream.get_job(record.job_id)
        status = job.get("status")
        if status in UNFINISHED_JOB_STATES:
            raise NotReady(f"job {record.job_id} is still {status}")
        if status not in JOB_STATUSES:
            raise NotReady(
                f"job {record.job_id} has status {_shown(status)}, not one of the spec's "
                f"{', '.join(sorted(JOB_STATUSES))}: not taken as finished, waiting for one of them"
            )
        assets: list[Mapping[str, Any]] = []
        if status == "completed" and record.event == "job.completed":
            asset_ids = _asset_ids(payload)
            if asset_ids:
                assets = await self._fetch_assets(asset_ids)
            elif not isinstance(job.get("urls"), dict) or not job["urls"]:
                # The spec promises neither: only a reconcile of the collection finds the files.
                log.warning(
                    "completed job names no files: the webhook named no asset_ids and the job "
                    "has no urls; `receiver reconcile --collection` delivers its assets",
                    job_id=record.job_id,
                    collection_id=job.get("collection_id"),
                )
        # The time the fetch began: a signed URL's clock starts no later than that.
        return Snapshot(job=job, assets=tuple(assets), fetched_at=started)

    async def refresh(
        self, record: EventRecord, snapshot: Snapshot, asset_ids: Collection[str]
    ) -> Snapshot:
        """A snapshot with the named assets fetched again (their signed URLs were refused);
        everything is fetched again when a file came from the job's own ``urls``."""
        known = {str(a.get("id")): i for i, a in enumerate(snapshot.assets)}
        if not asset_ids or any(asset_id not in known for asset_id in asset_ids):
            return await self.fetch(record)
        started = self._clock()
        wanted = {asset_id: asset_id for asset_id in asset_ids}
        fresh = await self._fetch_assets(wanted)
        assets = list(snapshot.assets)
        for asset_id, asset in zip(wanted, fresh, strict=True):
            assets[known[asset_id]] = asset
        return Snapshot(job=snapshot.job, assets=tuple(assets), fetched_at=started)

    def build(
        self, record: EventRecord, snapshot: Snapshot, traceparent: str | None = None
    ) -> Enriched:
        """The enriched event the sinks get, from a stored event and its snapshot (and the
        delivery attempt's traceparent, tracing on)."""
        payload = record.payload()
        job = snapshot.job
        files: list[FileRef] = []
        if job.get("status") == "completed" and record.event == "job.completed":
            asset_ids = _asset_ids(payload)
            if asset_ids and len(snapshot.assets) == len(asset_ids):
                files = [
                    _asset_file(asset, key, job, payload)
                    for key, asset in zip(asset_ids, snapshot.assets, strict=True)
                ]
            elif not asset_ids:
                files = _job_url_files(job)
        return Enriched(
            event_id=record.id,
            event_name=record.event,
            payload=payload,
            job=job,
            assets=tuple(snapshot.assets),
            files=tuple(files),
            received_at=record.received_at,
            processed_at=self._clock(),
            traceparent=traceparent,
        )

    async def enrich(self, record: EventRecord) -> Enriched:
        """Fetch and build in one go (for one-shot tools)."""
        return self.build(record, await self.fetch(record))

    async def _fetch_assets(self, asset_ids: Mapping[str, str]) -> list[Mapping[str, Any]]:
        fetches: list[Awaitable[dict[str, Any]]] = [
            self._fetch_asset(key, asset_id) for key, asset_id in asset_ids.items()
        ]
        assets: list[Mapping[str, Any]] = list(await asyncio.gather(*fetches))
        for key, asset in zip(asset_ids, assets, strict=True):
            if asset.get("status") != ASSET_READY:
                raise NotReady(f"asset {key} {asset.get('id')} is {asset.get('status')}")
            if not asset.get("file_url"):
                raise NotReady(f"asset {key} {asset.get('id')} has no file_url yet")
        return assets

    async def _fetch_asset(self, key: str, asset_id: str) -> dict[str, Any]:
        """One asset the event names; one the upstream does not know yet waits (NotReady)."""
        try:
            return await self._upstream.get_asset(asset_id)
        except PermanentError as exc:
            if exc.status != 404:
                raise
            raise NotReady(
                f"asset {key} {asset_id} not found upstream yet "
                "(a derived format can finish after its job)"
            ) from exc


def _asset_ids(payload: Mapping[str, Any]) -> dict[str, str]:
    raw = payload.get("asset_ids")
    if not isinstance(raw, dict):
        return {}
    return {str(k): v for k, v in raw.items() if isinstance(v, str) and v}


def _asset_file(
    asset: Mapping[str, Any], key: str, job: Mapping[str, Any], payload: Mapping[str, Any]
) -> FileRef:
    """The file of a fresh asset; its collection is the asset's, else the job's, else the one
    the event names (a reconciled event names the collection it was found in)."""
    url = asset.get("file_url")
    if not isinstance(url, str):
        raise TransientError(f"asset {asset.get('id')} has no file_url")
    return FileRef(
        asset_type=str(asset.get("type") or key),
        asset_id=str(asset.get("id")),
        url=url,
        collection_id=_str_or_none(
            asset.get("collection_id") or job.get("collection_id") or payload.get("collection_id")
        ),
        item_name=_str_or_none(job.get("item_name")),
    )


def _job_url_files(job: Mapping[str, Any]) -> list[FileRef]:
    urls = job.get("urls")
    if not isinstance(urls, dict):
        return []
    return [
        FileRef(
            asset_type=str(kind),
            asset_id=str(job.get("id")),
            url=url,
            collection_id=_str_or_none(job.get("collection_id")),
            item_name=_str_or_none(job.get("item_name")),
        )
        for kind, url in urls.items()
        if isinstance(url, str) and url
    ]


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _shown(value: Any) -> str:
    """An upstream value for a message: short, one line."""
    if value is None:
        return "none"
    return repr(" ".join(str(value).split())[:60])
