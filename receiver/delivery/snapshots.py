"""The event snapshots deliveries use (:class:`Snapshots`): the stored one while it is younger
than ``worker.job_max_age_seconds``, else fetched again, once per event in this process however
many lanes ask at the same moment, and stored."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

from receiver.delivery.enrich import Enricher
from receiver.store.asset_ledger import ledger_entries
from receiver.store.base import Store
from receiver.store.records import EventRecord, Snapshot


class Snapshots:
    """The event snapshots deliveries use: the stored one while fresh, else fetched again once
    per event in this process however many lanes ask at the same moment, and stored."""

    def __init__(
        self, *, store: Store, enricher: Enricher, max_age: float, clock: Callable[[], float]
    ) -> None:
        self._store = store
        self._enricher = enricher
        self._max_age = max_age
        self._clock = clock
        self._pending: dict[str, asyncio.Future[Snapshot]] = {}
        self._latest: dict[str, Snapshot] = {}

    def fresh(self, snapshot: Snapshot) -> bool:
        return self._clock() - snapshot.fetched_at <= self._max_age

    async def current(self, record: EventRecord) -> Snapshot:
        """A snapshot young enough to use for ``record``."""
        snapshot = self._newest(record)
        if snapshot is not None and self.fresh(snapshot):
            return snapshot
        return await self._refetch(record, snapshot, None)

    async def refused(
        self, record: EventRecord, used: Snapshot, asset_ids: Collection[str]
    ) -> Snapshot:
        """A snapshot with fresh URLs for the refused assets (unless one was fetched since)."""
        newest = self._newest(record)
        if newest is not None and newest.fetched_at > used.fetched_at:
            return newest
        return await self._refetch(record, used, asset_ids)

    def _newest(self, record: EventRecord) -> Snapshot | None:
        stored, latest = record.snapshot, self._latest.get(record.id)
        if latest is not None and (stored is None or latest.fetched_at > stored.fetched_at):
            return latest
        return stored

    async def _refetch(
        self, record: EventRecord, old: Snapshot | None, asset_ids: Collection[str] | None
    ) -> Snapshot:
        pending = self._pending.get(record.id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Snapshot] = asyncio.get_running_loop().create_future()
        self._pending[record.id] = future
        try:
            if old is None or asset_ids is None:
                snapshot = await self._enricher.fetch(record)
            else:
                snapshot = await self._enricher.refresh(record, old, asset_ids)
            await self._store.save_snapshot(
                record.id,
                snapshot,
                ledger=ledger_entries(record.event, record.job_id, snapshot.job, snapshot.assets),
                now=self._clock(),
            )
            self._latest[record.id] = snapshot
            future.set_result(snapshot)
            return snapshot
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters see it, nobody else needs to
            raise
        finally:
            del self._pending[record.id]
            if len(self._latest) > 10_000:  # only a cache for this process
                self._latest.clear()
