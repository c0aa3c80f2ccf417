"""Retention: processed events older than ``[store].retention_hours`` are deleted in paced
steps, the ledgers' rows older than ``[store].ledger_retention_days`` too (once their event is
gone), and the space they held is given back (SQLite's incremental vacuum).

Each step is one short transaction (:meth:`~receiver.store.base.Store.prune_step`) sized to hold
the writer about :data:`STEP_SECONDS`; after each, the loop waits long enough that steps hold it
at most :data:`SHARE` of the time while webhooks arrive, :data:`IDLE_SHARE` while none do (the
wait for its turn behind intake's groups is not counted in a step's time, or under load every
step would shrink to nothing; that it waited says intake is busy). A backlog of millions of
expired events (a first start after a long outage, a shorter retention) is then worked off over
minutes or hours while intake waits for at most one short step at a time, instead of one long
prune holding the writer. Once nothing is
left to prune, free pages beyond :data:`KEEP_FREE_BYTES` (which new rows would reuse anyway) are
given back in steps paced the same way.

A cycle starts at start-up and every hour (:mod:`receiver.store.retention_timing`, which also
holds the benchmarks' shortened retention). ``receiver_inbox_pruned_events_total`` counts the
events deleted, ``receiver_ledger_pruned_rows_total`` the ledger rows,
``receiver_inbox_vacuumed_bytes_total`` the bytes given back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from receiver.errors import StoreError, StoreUnavailable
from receiver.logs import get_logger
from receiver.observe.metrics import Metrics
from receiver.store.base import Store
from receiver.store.retention_timing import Timing

log = get_logger("receiver.retention")

#: The share of the time pruning and vacuuming may hold the writer while webhooks arrive (the
#: last step waited for its turn behind intake, or this process took webhooks meanwhile), and
#: while nothing else writes: a backlog goes quickly on a quiet inbox, slowly under load.
SHARE = 0.05
IDLE_SHARE = 0.3
#: Webhooks a second (in this process) from which intake counts as busy.
BUSY_RATE = 20.0
#: What one step aims to take; its size in events (or pages) follows what the last one took.
STEP_SECONDS = 0.02
FIRST_STEP_EVENTS = 100
#: No smaller: a step has a cost of its own (a round trip, a plan, the cascades' triggers), and
#: below this a loaded Postgres spent a step's time on that alone, pruning tens a second.
MIN_STEP_EVENTS = 100
MAX_STEP_EVENTS = 2000
FIRST_STEP_PAGES = 64
MAX_STEP_PAGES = 4096
#: Free pages kept inside the file: new rows reuse them, giving them back would only grow it again.
KEEP_FREE_BYTES = 8 * 1024 * 1024
#: During a long prune, free space is given back (Postgres without autovacuum: vacuumed) after
#: this many events too, not only once the backlog is gone.
RECLAIM_EVERY_EVENTS = 100_000
#: The longest pause between two steps (one slow step, on a cold cache, would otherwise stop
#: the loop for minutes).
MAX_PAUSE_SECONDS = 2.0
#: After a store error, the cycle is tried again this much later (a full disk, an outage).
RETRY_SECONDS = 30.0


def next_size(size: int, took: float, *, least: int, most: int) -> int:
    """The next step's size: this one's scaled towards :data:`STEP_SECONDS`, within bounds (at
    most doubling at a time, so one quick step on a quiet moment does not make the next long)."""
    if took <= 0:
        return min(size * 2, most)
    scaled = int(size * STEP_SECONDS / took)
    return max(least, min(scaled, size * 2, most))


class Retention:
    """The retention loop of a process that runs workers (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        timing: Timing,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self.timing = timing
        self._clock = clock
        self._events = FIRST_STEP_EVENTS
        self._pages = FIRST_STEP_PAGES
        self._vacuum_said = False
        self._seen = (self._accepted(), time.monotonic())  # webhooks accepted, when

    async def run(self) -> None:
        while True:
            try:
                await self.cycle()
                wait = self.timing.cycle_seconds
            except StoreError as exc:
                log.warning("retention cycle failed; trying again", error=exc.message)
                wait = min(RETRY_SECONDS, self.timing.cycle_seconds)
            await asyncio.sleep(wait)

    async def cycle(self) -> tuple[int, int]:
        """One cycle: prune what expired, then give back free space; (events, bytes)."""
        pruned = await self.prune()
        await self.forget()
        given_back = await self.reclaim()
        return pruned, given_back

    async def prune(self) -> int:
        older_than = self._clock() - self.timing.retention_seconds
        started = time.monotonic()
        total = 0
        while True:
            size = self._events
            step_started = time.monotonic()
            # Sized and paced by the time the step held the writer, not the time it waited
            # for its turn behind intake's groups (which under load is most of it).
            try:
                deleted, held = await self._store.prune_step(older_than=older_than, limit=size)
            except StoreUnavailable:
                # A step too large for a loaded database (it ran past store.timeout_seconds):
                # rolled back whole; go on with smaller ones, or give up for now if even those
                # fail.
                if size <= MIN_STEP_EVENTS:
                    raise
                self._events = max(MIN_STEP_EVENTS, size // 4)
                await asyncio.sleep(MAX_PAUSE_SECONDS)
                continue
            waited = time.monotonic() - step_started - held
            total += deleted
            self._metrics.inbox_pruned.inc(deleted)
            if deleted < size:
                break
            if total // RECLAIM_EVERY_EVENTS > (total - deleted) // RECLAIM_EVERY_EVENTS:
                # A long backlog: give back (or, on Postgres without autovacuum, vacuum) as it
                # goes, not only at its end.
                await self.reclaim()
            self._events = next_size(size, held, least=MIN_STEP_EVENTS, most=MAX_STEP_EVENTS)
            await self._pause(held, contended=waited > held)
        if total:
            seconds = time.monotonic() - started
            log.info(
                "pruned processed events",
                count=total,
                seconds=round(seconds, 1),
                per_second=round(total / seconds) if seconds > 0 else None,
            )
        return total

    async def forget(self) -> int:
        """Ledger rows past their retention whose event is gone, in paced steps."""
        if self.timing.ledger_seconds is None:
            return 0
        older_than = self._clock() - self.timing.ledger_seconds
        total = 0
        while True:
            size = self._events
            step_started = time.monotonic()
            deleted = await self._store.prune_ledgers_step(older_than=older_than, limit=size)
            took = time.monotonic() - step_started
            total += deleted
            if deleted < size:
                break
            await self._pause(took)
        if total:
            self._metrics.ledger_pruned.inc(total)
            log.info("forgot ledger rows past their retention", count=total)
        return total

    async def reclaim(self) -> int:
        space = await self._store.space()
        if space is None or not space.reclaimable:
            return 0
        if space.free_bytes is None:
            # Postgres with autovacuum off: one plain VACUUM of what was pruned.
            if not self._vacuum_said:
                self._vacuum_said = True
                log.warning(
                    "autovacuum is off on the database server: each retention cycle vacuums "
                    "the inbox's tables itself"
                )
            return await self._store.reclaim_space(max_pages=0)
        free = space.free_bytes
        total = 0
        while free - total > KEEP_FREE_BYTES:
            size = self._pages
            step_started = time.monotonic()
            given = await self._store.reclaim_space(max_pages=size)
            took = time.monotonic() - step_started
            if given <= 0:
                break
            total += given
            self._metrics.inbox_vacuumed_bytes.inc(given)
            self._pages = next_size(size, took, least=16, most=MAX_STEP_PAGES)
            await self._pause(took)
        if total:
            log.info("gave free inbox space back to the file system", bytes=total)
        return total

    async def _pause(self, took: float, *, contended: bool = False) -> None:
        """Wait so that steps hold the writer at most :data:`SHARE` of the time while intake is
        busy (``contended``: the step waited for its turn; or webhooks arrive in this process
        since the last pause), :data:`IDLE_SHARE` while it is not."""
        accepted = self._accepted()
        now = time.monotonic()
        rate = (accepted - self._seen[0]) / max(now - self._seen[1], 1e-3)
        self._seen = (accepted, now)
        share = SHARE if contended or rate >= BUSY_RATE else IDLE_SHARE
        await asyncio.sleep(min(max(took * (1 / share - 1), 0.001), MAX_PAUSE_SECONDS))
        self._seen = (self._accepted(), time.monotonic())

    def _accepted(self) -> float:
        return self._metrics.webhook_requests.labels("accepted").get()
