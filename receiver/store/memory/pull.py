"""The in-memory inbox's watch list and job-outcome ledger (see :mod:`receiver.store.pull`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from receiver.store.asset_ledger import LedgerEntry
from receiver.store.memory.records import MemoryTables
from receiver.store.pull import (
    REWATCHED,
    WatchRecord,
    WatchState,
    admit,
    next_poll,
    outcome_key,
    watch_due,
    watch_expired,
)
from receiver.store.records import NewEvent


@dataclass
class _Watch:
    record: WatchRecord
    next_poll_at: float | None
    lease_owner: str | None = None
    lease_expires_at: float | None = None


class MemoryPull(MemoryTables):
    """The :class:`~receiver.store.pull.PullStore` methods of the memory store."""

    def __init__(self) -> None:
        super().__init__()
        self._watches: dict[str, _Watch] = {}
        self._outcomes: dict[str, str] = {}
        self._ledger: dict[str, float | None] = {}

    def _record_ledger(self, event_id: str, entries: Sequence[LedgerEntry]) -> None:
        for entry in entries:
            times = [t for t in (self._ledger.get(entry.key), entry.upstream_time) if t is not None]
            self._ledger[entry.key] = max(times) if times else None

    async def prune_ledgers_step(self, *, older_than: float, limit: int) -> int:
        self._check()
        return 0

    async def ledger(self, keys: list[str]) -> dict[str, float | None]:
        self._check()
        return {key: self._ledger[key] for key in keys if key in self._ledger}

    def _admit(self, event: NewEvent) -> bool:
        """Apply the job-outcome rule to a new event id; whether it may be stored."""
        ok, _record = admit(self._outcomes, outcome_key(event.event, event.job_id), event.source)
        return ok

    async def add_watches(
        self, job_ids: list[str], *, now: float, expires_at: float
    ) -> list[WatchRecord]:
        self._check()
        out = []
        for job_id in dict.fromkeys(job_ids):
            watch = self._watches.get(job_id)
            if watch is None or watch.record.state in REWATCHED:
                record = WatchRecord(job_id, "watching", now, expires_at, None, 0, None, now)
                watch = self._watches[job_id] = _Watch(record, now)
            out.append(watch.record)
        return out

    async def claim_watches(
        self, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> list[WatchRecord]:
        self._check()
        due = [
            w
            for w in self._watches.values()
            if watch_due(
                w.record.state, w.next_poll_at, w.record.expires_at, w.lease_expires_at, now
            )
        ]
        due.sort(key=lambda w: w.next_poll_at or 0.0)
        for w in due[: max(limit, 0)]:
            w.lease_owner, w.lease_expires_at = owner, now + lease_seconds
        return [w.record for w in due[: max(limit, 0)]]

    async def settle_watch(
        self,
        job_id: str,
        *,
        owner: str,
        state: WatchState,
        now: float,
        next_poll_at: float | None = None,
        error: str | None = None,
    ) -> None:
        self._check()
        w = self._watches.get(job_id)
        if w is None or w.lease_owner != owner:
            return
        w.record = dataclasses.replace(
            w.record,
            state=state,
            last_polled_at=now,
            polls=w.record.polls + 1,
            last_error=error,
            updated_at=now,
        )
        w.next_poll_at = next_poll(state, now, next_poll_at)
        w.lease_owner = w.lease_expires_at = None

    async def expire_watches(self, *, now: float) -> int:
        self._check()
        count = 0
        for w in self._watches.values():
            if watch_expired(w.record.state, w.record.expires_at, w.lease_expires_at, now):
                w.record = dataclasses.replace(w.record, state="expired", updated_at=now)
                w.lease_owner = w.lease_expires_at = None
                count += 1
        return count

    async def list_watches(
        self, *, state: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[WatchRecord]:
        self._check()
        records = [w.record for w in self._watches.values() if state in (None, w.record.state)]
        records.sort(key=lambda r: (-r.since, r.job_id))
        start = max(offset, 0)
        return records[start : start + max(limit, 0)]

    async def watch_counts(self) -> dict[str, int]:
        self._check()
        counts: dict[str, int] = {}
        for w in self._watches.values():
            counts[w.record.state] = counts.get(w.record.state, 0) + 1
        return counts

    async def known_outcomes(self, keys: list[str]) -> set[str]:
        self._check()
        return {key for key in keys if key in self._outcomes}
