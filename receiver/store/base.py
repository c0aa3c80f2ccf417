"""The inbox interface every store backend implements (its records: :mod:`receiver.store.records`).

An *event* is one verified webhook, stored with its raw body before the receiver answers 2xx. Each
event has one *delivery* per sink that wants it; deliveries carry their own state, attempt count
and next attempt time, so each sink retries on its own.

Processing has two steps, each claimed with a lease (a worker that dies loses its claims when
the lease runs out, and another worker takes them over: at-least-once processing):

1. *Enrichment*, once per event: an event without a :class:`Snapshot` is claimed, the fresh job
   and assets are fetched and stored with it (:meth:`Store.save_snapshot`), or the attempt is
   recorded with a backoff (:meth:`Store.fail_enrichment`).
2. *Delivery*, per sink (a *lane*): :meth:`Store.claim_deliveries` leases the due deliveries of one
   sink whose event has a snapshot, as many as the lane may send now (its free slots, its token
   bucket, unless paused), in due-time order; :meth:`Store.settle` records each result.

Delivery states: ``pending`` (due at ``next_attempt_at``), ``done``, ``dead`` (gave up; can be
redelivered), ``skipped`` (the fresh job showed the sink's filter does not match).

An event's state is derived from its deliveries: ``pending`` while any delivery is pending,
else ``dead`` if any is dead, else ``done``. The rules themselves live in
:mod:`receiver.store.rules`; the backends only run the queries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from receiver.store.asset_ledger import LedgerEntry
from receiver.store.batches import (
    BatchIds,
    BatchList,
    RedeliveryBatch,
    RedeliveryFilter,
    RedeliveryPreview,
)
from receiver.store.browse import Cursor, DeadGroupList, EventList, EventQuery, InboxOverview
from receiver.store.lanes_model import (
    LaneClaim,
    LanePause,
    LanePolicy,
    LaneResult,
    LaneState,
    LaneStats,
    Leases,
)
from receiver.store.pull import PullStore
from receiver.store.records import (
    EventRecord,
    EventState,
    NewEvent,
    Outcome,
    PruneStep,
    Snapshot,
)
from receiver.store.space import InboxSpace
from receiver.store.steps import Step


class Store(PullStore, Protocol):
    """The inbox. Every method is safe to call concurrently from one event loop.

    The watch list and the job-outcome ledger of pull mode are :class:`PullStore`'s half.

    Methods raise :class:`~receiver.errors.StoreUnavailable` when the backend cannot be reached
    or written, never a driver exception.
    """

    async def open(self) -> None:
        """Connect, create or migrate the schema."""

    async def close(self) -> None:
        """Finish pending writes and disconnect."""

    async def ping(self) -> None:
        """Raise StoreUnavailable unless the store answers a trivial query."""

    async def add_event(self, event: NewEvent) -> bool:
        """Store the event and its delivery rows durably; False if its id was already stored
        (or the job-outcome rule of :mod:`receiver.store.pull` refuses it).

        Returns only after the commit: a 2xx may be sent the moment this returns. Raises
        :class:`~receiver.errors.PayloadError` when the id, name or job id holds what no store
        can keep (NUL, a lone surrogate: :func:`receiver.store.rules.refuse_unstorable`), for
        this caller alone.
        """

    async def claim_enrichment(
        self, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> list[EventRecord]:
        """Lease up to ``limit`` events that need their snapshot fetched and are due, oldest due
        first, that nobody else holds."""

    async def save_snapshot(
        self,
        event_id: str,
        snapshot: Snapshot,
        *,
        finished: Mapping[str, Outcome] | None = None,
        ledger: Sequence[LedgerEntry] = (),
        now: float,
        steps: Sequence[Step] = (),
    ) -> EventState:
        """Store the event's snapshot (its deliveries become claimable), settle the deliveries
        in ``finished`` (sink -> outcome: filtered out, or no longer configured) and drop the
        enrichment lease. Also replaces an older snapshot (a delivery refetched a stale one).
        ``ledger`` goes into the asset ledger in the same transaction
        (:mod:`receiver.store.asset_ledger`), and ``steps`` (the upstream calls that fetched it,
        :mod:`receiver.store.steps`) into its timeline. Returns the event's state; raises
        UnknownEvent for an unknown id."""

    async def fail_enrichment(
        self,
        event_id: str,
        *,
        error: str,
        retry_at: float | None,
        now: float,
        steps: Sequence[Step] = (),
    ) -> EventState:
        """Record a failed enrichment attempt, as a failed attempt of every pending delivery of
        the event too (see :func:`receiver.store.rules.enrichment_failed`): due again at
        ``retry_at``, or, when None, given up: dead with ``error``. Drops the lease; ``steps``
        (the calls that failed) go into its timeline; returns the event's state."""

    async def claim_deliveries(
        self, policy: LanePolicy, *, owner: str, limit: int, lease_seconds: float, now: float
    ) -> LaneClaim:
        """Lease the due deliveries of ``policy.sink`` whose event has a snapshot: at most
        ``limit`` and at most what the lane's tokens allow, none while it is paused; oldest due
        first. The lane's state is taken and written in the same transaction, so several
        processes sharing the store together keep to the lane's rate."""

    async def extend_leases(
        self, leases: Leases, *, owner: str, lease_seconds: float, now: float
    ) -> None:
        """Push the leases this owner still holds."""

    async def release(self, leases: Leases, *, owner: str) -> None:
        """Drop this owner's leases so the work can be claimed again at once."""

    async def settle(
        self,
        event_id: str,
        sink: str,
        outcome: Outcome,
        *,
        now: float,
        lane: LaneResult | None = None,
        steps: Sequence[Step] = (),
    ) -> EventState:
        """Record the result of one delivery attempt (dropping its lease) and its ``steps`` (the
        attempt, and any calls it made), update the event's state and, with ``lane``, the
        lane's circuit and pause. Returns the event's new state
        (so exactly one settle sees an event finish)."""

    async def lane_stats(self, *, now: float) -> dict[str, LaneStats]:
        """Backlog, oldest due time and leased count per sink (sinks with any pending)."""

    async def pending_sinks(self) -> set[str]:
        """The sinks with any pending delivery, found without counting them (cheap with a
        million pending, unlike :meth:`lane_stats`)."""

    async def get(self, event_id: str) -> EventRecord | None:
        """One event with its deliveries, or None."""

    async def event_steps(self, event_id: str) -> list[Step]:
        """The event's timeline: its upstream calls and delivery attempts by start time (the
        newest :data:`~receiver.store.steps.MAX_STEPS_PER_DELIVERY` of each delivery); empty
        for an unknown id."""

    async def list(
        self, *, state: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[EventRecord]:
        """Events newest first, optionally only those in ``state``."""

    async def prune(self, *, older_than: float, batch: int = 1000) -> int:
        """Delete finished (``done``) events received before ``older_than``; returns how many.
        Runs :meth:`prune_step` until nothing is left (the retention loop paces its steps
        itself: :mod:`receiver.ops.retention`)."""

    async def prune_step(self, *, older_than: float, limit: int) -> PruneStep:
        """Delete at most ``limit`` finished events received before ``older_than``, in one
        short transaction; how many, and how long its statements ran."""

    async def space(self) -> InboxSpace | None:
        """What the inbox takes on disk and how much of it is free inside it; None for a
        backend with nothing to measure."""

    async def reclaim_space(self, *, max_pages: int) -> int:
        """Give back to the file system at most ``max_pages`` of the inbox's free pages, in one
        short transaction; returns the bytes given back (0 when the backend cannot)."""

    async def counts(self) -> tuple[dict[str, int], float | None]:
        """Events per state, and the receipt time of the oldest pending event (or None)."""

    def on_new_events(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when another process adds events or makes deliveries claimable
        (backends that can tell)."""

    # -- reading for people (the inbox page; see receiver.store.browse) --------------------------

    async def browse(
        self,
        query: EventQuery,
        *,
        before: Cursor | None = None,
        after: Cursor | None = None,
        limit: int = 50,
    ) -> EventList:
        """Up to ``limit`` events matching ``query``, newest first, with their deliveries.

        ``before`` gives the events just older than the cursor, ``after`` those just newer.
        """

    async def overview(
        self, *, now: float, failing_since: float, errors: int = 10
    ) -> InboxOverview:
        """Per-sink backlog, due, in-flight and failing counts, and the latest failures."""

    async def dead_letters(self, *, groups: int = 100, samples: int = 5) -> DeadGroupList:
        """Dead deliveries grouped by sink and last error, the largest groups first."""

    # -- operating through an incident (receiver.store.batches; lane pauses) ---------------------

    async def preview_redelivery(
        self, flt: RedeliveryFilter, *, now: float, sample: int = 5
    ) -> RedeliveryPreview:
        """How many deliveries ``flt`` selects now, and the first ``sample`` of them (in event
        id and sink order); changes nothing."""

    async def create_redelivery(
        self, flt: RedeliveryFilter, *, batch_id: str, created_by: str, now: float
    ) -> RedeliveryBatch:
        """Store a running batch for ``flt`` (``matched`` counted now); nothing is queued yet:
        :meth:`step_redelivery` does that."""

    async def step_redelivery(self, batch_id: str, *, limit: int, now: float) -> int | None:
        """One step of a queuing batch, in one short transaction: the next ``limit`` events at
        most after its cursor, their matching deliveries made pending and due ``now`` (their
        job fetched again first when they have none) and marked with the batch. Returns how
        many it queued, or None when the batch has nothing to queue (unknown, cancelled,
        queued, or being stepped by another replica right now)."""

    async def finish_redeliveries(self, *, now: float) -> BatchIds:
        """Mark done (keeping their counts) the queued batches none of whose deliveries is
        pending any more, and close cancelled ones likewise; their ids. A cancelled batch first
        withdraws, as its cancel did, what an attempt in flight at the cancel left waiting for
        a retry."""

    async def queuing_redeliveries(self) -> BatchIds:
        """The ids of the running batches still queuing."""

    async def redelivery(self, batch_id: str) -> RedeliveryBatch | None:
        """One batch with its progress, or None."""

    async def redeliveries(self, *, limit: int = 50) -> BatchList:
        """The newest batches first, with their progress."""

    async def cancel_redelivery(self, batch_id: str, *, now: float) -> RedeliveryBatch:
        """Cancel a running batch: it queues nothing more, and every delivery it queued that
        is still pending and not leased at ``now`` (no lane has started to send it) is put back
        as it was before the batch (state, attempts, due time, last error, the batch that had
        it; its event's enrichment when nothing of it is pending any more) and is no longer the
        batch's; the batch's ``withdrawn`` counts them. The cancel and the first of them are one
        transaction; a large batch's rest follows in short ones before this returns, and no lane
        claims any of them meanwhile. Deliveries in flight may still complete and count. Raises
        UnknownBatch. A finished batch (done, or cancelled and closed) is left as it is;
        cancelling a cancelled one withdraws again."""

    async def pause_lane(
        self, sink: str, *, until: float | None, reason: str | None, now: float
    ) -> LanePause:
        """Pause ``sink``'s lane for every replica until ``until`` (None: until resumed): it
        claims nothing, its deliveries wait with their attempts untouched. Pausing a paused
        lane changes its end and reason, not since when it is paused."""

    async def resume_lane(self, sink: str, *, now: float) -> LanePause | None:
        """End the lane's pause; the pause that was in force, if any."""

    async def lane_states(self) -> dict[str, LaneState]:
        """Every lane's shared state (pacing, circuit, pause) by sink."""
