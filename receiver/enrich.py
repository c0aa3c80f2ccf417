"""Turning a stored webhook into the enriched event: the fresh job and its fresh assets.

The webhook body is only a hint. The job is fetched again, and for ``job.completed`` each asset
named in the event's ``asset_ids`` is fetched for its current status and a fresh signed
``file_url`` (the URLs in the webhook may have expired). Only when the event names no asset ids
are the fresh job's ``urls`` used. Anything not finished yet raises :class:`NotReady`, so the
delivery is retried later instead of skipping a file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from receiver.errors import NotReady, TransientError
from receiver.events import Enriched, FileRef
from receiver.store.base import EventRecord

UNFINISHED_JOB_STATES = frozenset({"pending", "processing"})
ASSET_READY = "completed"


class JobSource(Protocol):
    """What enrichment needs from the upstream API client."""

    async def get_job(self, job_id: str) -> dict[str, Any]: ...

    async def get_asset(self, asset_id: str) -> dict[str, Any]: ...


class Enricher:
    """Builds :class:`Enriched` events from stored ones, using the upstream API."""

    def __init__(self, upstream: JobSource, *, clock: Callable[[], float]) -> None:
        self._upstream = upstream
        self._clock = clock

    async def enrich(self, record: EventRecord) -> Enriched:
        """Fetch the fresh job (and assets) for a stored event; raise DeliveryError if not ready."""
        payload = record.payload()
        job = await self._upstream.get_job(record.job_id)
        status = job.get("status")
        if status in UNFINISHED_JOB_STATES:
            raise NotReady(f"job {record.job_id} is still {status}")
        assets: list[Mapping[str, Any]] = []
        files: list[FileRef] = []
        if status == "completed" and record.event == "job.completed":
            asset_ids = _asset_ids(payload)
            if asset_ids:
                assets = await self._fetch_assets(asset_ids)
                files = [
                    _asset_file(asset, key, job)
                    for key, asset in zip(asset_ids, assets, strict=True)
                ]
            else:
                files = _job_url_files(job)
        return Enriched(
            event_id=record.id,
            event_name=record.event,
            payload=payload,
            job=job,
            assets=tuple(assets),
            files=tuple(files),
            received_at=record.received_at,
            processed_at=self._clock(),
        )

    async def _fetch_assets(self, asset_ids: dict[str, str]) -> list[Mapping[str, Any]]:
        fetches: list[Awaitable[dict[str, Any]]] = [
            self._upstream.get_asset(asset_id) for asset_id in asset_ids.values()
        ]
        assets: list[Mapping[str, Any]] = list(await asyncio.gather(*fetches))
        for key, asset in zip(asset_ids, assets, strict=True):
            if asset.get("status") != ASSET_READY:
                raise NotReady(f"asset {key} {asset.get('id')} is {asset.get('status')}")
            if not asset.get("file_url"):
                raise NotReady(f"asset {key} {asset.get('id')} has no file_url yet")
        return assets


def _asset_ids(payload: Mapping[str, Any]) -> dict[str, str]:
    raw = payload.get("asset_ids")
    if not isinstance(raw, dict):
        return {}
    return {str(k): v for k, v in raw.items() if isinstance(v, str) and v}


def _asset_file(asset: Mapping[str, Any], key: str, job: Mapping[str, Any]) -> FileRef:
    url = asset.get("file_url")
    if not isinstance(url, str):
        raise TransientError(f"asset {asset.get('id')} has no file_url")
    return FileRef(
        asset_type=str(asset.get("type") or key),
        asset_id=str(asset.get("id")),
        url=url,
        collection_id=_str_or_none(asset.get("collection_id") or job.get("collection_id")),
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
