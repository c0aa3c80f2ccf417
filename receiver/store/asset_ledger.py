"""The asset ledger: which of the upstream's assets an event of this inbox has taken in charge.

Reconcile (:mod:`receiver.pull.reconcile`) judges "already delivered" per asset, whichever way
the asset arrived (webhook, poll or an earlier reconcile). The upstream does not promise that
an asset names the job that made it (``metadata`` is free-form), so the job-outcome ledger alone
cannot answer; this ledger is written with each event's job snapshot, in the same transaction
(:meth:`Store.save_snapshot`), once the event's files are known and its deliveries are due.
Like the job-outcome ledger it is not pruned with the events.

Keys (a few dozen bytes each):

- ``asset <asset id>``: the event fetched this asset (its webhook or reconcile named it);
- ``job <job id> <type>``: the event took the job's file of that type from the job's ``urls``
  (the webhook named no asset ids, so the asset ids are not known);
- ``item <item id> <type>``: the same, by the job's item; its ``upstream_time`` is when the job
  last changed (the upstream's ``updated_at``), so only assets of that item created by then
  count as delivered by it;
- ``url <scheme://host/path>``: the same, by the file's address without its query (a signed
  URL's signature changes; where the file lives does not), matched against an asset's
  ``file_url`` when neither the asset nor the job names the other;
- ``job <job id>``: the event of that job has its snapshot (its files are settled), so an
  outcome the job-outcome ledger holds no longer means "still to be fetched".

Rows older than ``[store].ledger_retention_days`` are forgotten once their event is pruned
(:mod:`receiver.ops.retention`). One row of its own, :data:`FORGOTTEN_BEFORE`, never forgotten,
keeps (as its ``upstream_time``) the time before which rows may have been: an asset created
before then may have been delivered and forgotten, so reconcile skips it; one created since
cannot have a forgotten row (its row would be younger than the asset).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit


@dataclass(frozen=True)
class LedgerEntry:
    """One row of the asset ledger."""

    key: str
    upstream_time: float | None = None


#: The ledger's own row: ``upstream_time`` is when rows may have been forgotten up to (or none).
FORGOTTEN_BEFORE = "retention forgotten-before"


def asset_key(asset_id: str) -> str:
    return f"asset {asset_id}"


def job_key(job_id: str) -> str:
    return f"job {job_id}"


def job_type_key(job_id: str, asset_type: str) -> str:
    return f"job {job_id} {asset_type}"


def item_type_key(item_id: str, asset_type: str) -> str:
    return f"item {item_id} {asset_type}"


def url_key(url: object) -> str | None:
    """The ledger key of a file's address: scheme, host and path, no query or fragment."""
    if not isinstance(url, str) or not url:
        return None
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if not parts.scheme or not parts.netloc:
        return None
    return f"url {parts.scheme}://{parts.netloc}{parts.path}"


def upstream_time(value: object) -> float | None:
    """An ISO 8601 time from the upstream as a unix time; None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def ledger_entries(
    event: str, job_id: str, job: Mapping[str, Any], assets: tuple[Mapping[str, Any], ...]
) -> list[LedgerEntry]:
    """What an ``event`` of ``job_id`` whose snapshot holds ``job`` and ``assets`` takes in
    charge. Only ``job.completed`` of a completed job has files: for any other, nothing.
    """
    if event != "job.completed" or job.get("status") != "completed":
        return []
    entries = {job_key(job_id): LedgerEntry(job_key(job_id))}
    if assets:
        for asset in assets:
            ident = asset.get("id")
            if isinstance(ident, str) and ident:
                entries[asset_key(ident)] = LedgerEntry(asset_key(ident))
        return list(entries.values())
    urls = job.get("urls")
    item_id = job.get("item_id")
    changed = upstream_time(job.get("updated_at"))
    for asset_type, url in urls.items() if isinstance(urls, dict) else ():
        key = job_type_key(job_id, str(asset_type))
        entries[key] = LedgerEntry(key)
        if (where := url_key(url)) is not None:
            entries[where] = LedgerEntry(where)
        if isinstance(item_id, str) and item_id and changed is not None:
            key = item_type_key(item_id, str(asset_type))
            entries[key] = LedgerEntry(key, changed)
    return list(entries.values())
