"""What pull mode keeps in the inbox: the job watch list and the ledger of job outcomes.

**Watch list.** One row per watched job id. States::

    watching ──(job completed or failed)──► done
        │──────(upstream answers 404)─────► not_found
        └──────(watch_expiry_hours pass)──► expired

Watching again a job whose watch ``expired`` or ended ``not_found`` starts a new watch; watching
a job already ``watching`` or ``done`` changes nothing. A poller *claims* ``watching`` rows with
a lease (``lease_owner``/``lease_expires_at``) so that two pollers, in one process or in
replicas sharing a Postgres inbox, never poll the same job at once; a poller that dies loses its
claims when the lease runs out.

**Job outcomes.** One row per job outcome (``job.completed`` or ``job.failed`` of one job id),
keyed ``"<event> <job_id>"``, written in the same transaction as the event that first brought
it. It is the rule that makes a job's outcome reach each sink once, whichever way it arrives:

- an event made by a poll is stored only if no event for that job outcome was stored before,
  by any source;
- a webhook is stored unless an event made by the receiver already holds its job outcome;
- an event made by reconcile is stored whatever the ledger holds: reconcile judges each asset
  by the asset ledger (:mod:`receiver.store.asset_ledger`) before it makes one, and names only
  the assets no event has taken; it records the outcome when it is the first to bring it.
  Webhooks among themselves are deduplicated by event id only, as the upstream specifies
  (so two webhooks with different event ids are both delivered).

Refused events count as duplicates: ``add_event`` returns False, as for a known event id. The
ledger is not pruned with the events (a row is a few dozen bytes), so a reconcile run weeks
later still knows which jobs were delivered.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

WatchState = Literal["watching", "done", "expired", "not_found"]
WATCH_STATES: tuple[WatchState, ...] = ("watching", "done", "expired", "not_found")
#: Events that end a job: each is one job outcome.
OUTCOME_EVENTS = frozenset({"job.completed", "job.failed"})
#: Where an event came from: the upstream's webhook, or the receiver's own poll or reconcile.
SOURCES = ("webhook", "poll", "reconcile")
WEBHOOK = "webhook"
RECONCILE = "reconcile"


def outcome_key(event: str, job_id: str) -> str | None:
    """The job-outcome key of an event (``"job.completed <job id>"``), None for other events."""
    return f"{event} {job_id}" if event in OUTCOME_EVENTS else None


def supersedes(prior_source: str, source: str) -> bool:
    """Whether an outcome already stored by ``prior_source`` makes an event from ``source`` a
    duplicate (see the module docstring)."""
    if source == RECONCILE:
        return False  # reconcile judged each of its assets by the asset ledger already
    return not (prior_source == WEBHOOK and source == WEBHOOK)


def admit(held: dict[str, str], key: str | None, source: str) -> tuple[bool, bool]:
    """Whether an event may be stored given the outcomes ``held`` (key -> source), and whether
    its key is to be recorded. ``held`` is updated, so a batch is judged in order."""
    if key is None:
        return True, False
    prior = held.get(key)
    if prior is None:
        held[key] = source
        return True, True
    return not supersedes(prior, source), False


#: A watch that ended so starts again when its job is watched again (see the module docstring).
REWATCHED = frozenset({"expired", "not_found"})


def watch_due(
    state: str,
    next_poll_at: float | None,
    expires_at: float,
    lease_expires_at: float | None,
    now: float,
) -> bool:
    """A watch a poller may claim: ``watching``, due for a poll, not expired, nobody holding it
    (what every backend's claim asks; the SQL backends in their ``CLAIM_WATCHES``)."""
    return (
        state == "watching"
        and next_poll_at is not None
        and next_poll_at <= now
        and expires_at > now
        and (lease_expires_at is None or lease_expires_at < now)
    )


def watch_expired(
    state: str, expires_at: float, lease_expires_at: float | None, now: float
) -> bool:
    """A ``watching`` row past its expiry that nobody holds (``EXPIRE_WATCHES`` in SQL)."""
    return (
        state == "watching"
        and expires_at <= now
        and (lease_expires_at is None or lease_expires_at < now)
    )


def next_poll(state: WatchState, now: float, next_poll_at: float | None) -> float | None:
    """When a settled watch is polled again: only a ``watching`` one, at ``next_poll_at`` or now."""
    if state != "watching":
        return None
    return now if next_poll_at is None else next_poll_at


def valid_job_id(value: object) -> bool:
    """Job ids are UUIDs (the upstream's ids); anything else is refused before it is stored."""
    if not isinstance(value, str) or len(value) != 36:
        return False
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class WatchRecord:
    """One watched job: its state, when it was watched, polled and when it expires."""

    job_id: str
    state: WatchState
    since: float
    expires_at: float
    last_polled_at: float | None
    polls: int
    last_error: str | None
    updated_at: float

    def as_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "state": self.state,
            "since": self.since,
            "expires_at": self.expires_at,
            "last_polled_at": self.last_polled_at,
            "polls": self.polls,
            "last_error": self.last_error,
        }


# The column order the SQL backends select watch rows in.
WATCH_COLUMNS = "job_id, state, since, expires_at, last_polled_at, polls, last_error, updated_at"


def watch_records(rows: Iterable[Any]) -> list[WatchRecord]:
    """Records from rows in ``WATCH_COLUMNS`` order."""
    return [
        WatchRecord(
            job_id=row[0],
            state=row[1],
            since=row[2],
            expires_at=row[3],
            last_polled_at=row[4],
            polls=row[5],
            last_error=row[6],
            updated_at=row[7],
        )
        for row in rows
    ]


class PullStore(Protocol):
    """The store's pull-mode half (every backend implements it beside :class:`Store`)."""

    async def add_watches(
        self, job_ids: list[str], *, now: float, expires_at: float
    ) -> list[WatchRecord]:
        """Watch these jobs (see the module docstring for re-watching); their records."""

    async def claim_watches(
        self, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> list[WatchRecord]:
        """Lease up to ``limit`` ``watching`` rows due for a poll that nobody else holds."""

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
        """Record one poll of a claimed watch and release it: its new state; for ``watching``,
        when to poll next (``None`` = now) and the error that delayed it, if any."""

    async def expire_watches(self, *, now: float) -> int:
        """End as ``expired`` every ``watching`` row past its expiry; returns how many."""

    async def list_watches(
        self, *, state: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[WatchRecord]:
        """Watches newest first, optionally only those in ``state``."""

    async def watch_counts(self) -> dict[str, int]:
        """Watches per state."""

    async def known_outcomes(self, keys: list[str]) -> set[str]:
        """Which of these job-outcome keys the ledger holds."""

    async def ledger(self, keys: list[str]) -> dict[str, float | None]:
        """Which of these keys the asset ledger holds, each with its upstream time
        (:mod:`receiver.store.asset_ledger`)."""

    async def prune_ledgers_step(self, *, older_than: float, limit: int) -> int:
        """Forget at most ``limit`` rows of each ledger (job outcomes, assets) recorded before
        ``older_than`` whose event is no longer in the inbox, in one short transaction;
        returns how many. (The memory store keeps its ledgers for its life.)"""
