"""The inbox interface every store backend implements, and the records it hands out.

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

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson

from receiver.store.asset_ledger import LedgerEntry
from receiver.store.pull import PullStore

if TYPE_CHECKING:
    from receiver.store.lanes_model import (
        LaneClaim,
        LanePolicy,
        LaneResult,
        LaneStats,
        Leases,
    )

if TYPE_CHECKING:
    from receiver.store.browse import (
        Cursor,
        DeadGroupList,
        EventList,
        EventQuery,
        InboxOverview,
    )


def headers_json(headers: Mapping[str, str]) -> str:
    """An event's kept headers as stored: compact JSON (written for every webhook stored, so
    with orjson, in a tenth of json.dumps' time)."""
    return orjson.dumps(headers if isinstance(headers, dict) else dict(headers)).decode()


DeliveryState = Literal["pending", "done", "dead", "skipped"]
EventState = Literal["pending", "done", "dead"]
EVENT_STATES: tuple[EventState, ...] = ("pending", "done", "dead")


@dataclass(frozen=True)
class NewEvent:
    """A verified webhook about to be stored, with the sinks that get a delivery row."""

    id: str
    event: str
    job_id: str
    body: bytes
    headers: Mapping[str, str]
    received_at: float
    sinks: tuple[str, ...]
    #: ``webhook``, or ``poll``/``reconcile`` for events the receiver made (receiver.store.pull)
    source: str = "webhook"


@dataclass(frozen=True)
class Snapshot:
    """The fresh job and assets fetched for an event, shared by all of its deliveries."""

    job: Mapping[str, Any]
    assets: tuple[Mapping[str, Any], ...]
    fetched_at: float

    def to_json(self) -> str:
        return json.dumps(
            {"job": self.job, "assets": list(self.assets)},
            separators=(",", ":"),
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str | bytes, fetched_at: float) -> Snapshot:
        data = json.loads(text)
        return cls(job=data["job"], assets=tuple(data["assets"]), fetched_at=fetched_at)


@dataclass(frozen=True)
class DeliveryRecord:
    event_id: str
    sink: str
    state: DeliveryState
    attempts: int
    next_attempt_at: float | None
    last_error: str | None
    updated_at: float
    leased_until: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "sink": self.sink,
            "state": self.state,
            "attempts": self.attempts,
            "next_attempt_at": self.next_attempt_at,
            "last_error": self.last_error,
            "updated_at": self.updated_at,
            "leased_until": self.leased_until,
        }


@dataclass(frozen=True)
class EventRecord:
    id: str
    event: str
    job_id: str
    body: bytes
    headers: Mapping[str, str]
    received_at: float
    state: EventState
    deliveries: tuple[DeliveryRecord, ...] = ()
    snapshot: Snapshot | None = None
    # Enrichment: due at ``enrich_at`` while no snapshot was stored yet, None once one was
    # (or enrichment gave up); attempts made and the last error.
    enrich_at: float | None = None
    enrich_attempts: int = 0
    enrich_error: str | None = None

    def payload(self) -> dict[str, Any]:
        """The webhook body, parsed (it was validated as a JSON object at intake)."""
        value = json.loads(self.body)
        assert isinstance(value, dict)
        return value

    def as_json(self, *, with_body: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "event": self.event,
            "job_id": self.job_id,
            "state": self.state,
            "received_at": self.received_at,
            "enrichment": {
                "fetched_at": self.snapshot.fetched_at if self.snapshot else None,
                "attempts": self.enrich_attempts,
                "next_attempt_at": self.enrich_at,
                "last_error": self.enrich_error,
            },
            "deliveries": [d.as_json() for d in self.deliveries],
        }
        if with_body:
            out["headers"] = dict(self.headers)
            out["payload"] = self.payload()
        return out


# The column orders the SQL backends select in, so one function maps rows to records.
EVENT_COLUMNS = (
    "id, event, job_id, body, headers, received_at, state, "
    "snapshot, fetched_at, enrich_at, enrich_attempts, enrich_error"
)
DELIVERY_COLUMNS = (
    "event_id, sink, state, attempts, next_attempt_at, last_error, updated_at, lease_expires_at"
)


def delivery_record(d: Sequence[Any]) -> DeliveryRecord:
    """A record from a row in ``DELIVERY_COLUMNS`` order."""
    return DeliveryRecord(
        event_id=d[0],
        sink=d[1],
        state=d[2],
        attempts=d[3],
        next_attempt_at=d[4],
        last_error=d[5],
        updated_at=d[6],
        leased_until=d[7],
    )


def event_records(
    rows: Sequence[Sequence[Any]], delivery_rows: Iterable[Sequence[Any]]
) -> list[EventRecord]:
    """Records from event rows (``EVENT_COLUMNS`` first, headers and snapshot as JSON text) and
    the rows of their deliveries (``DELIVERY_COLUMNS``), each event's deliveries in the order
    given."""
    by_event: dict[str, list[DeliveryRecord]] = {}
    for d in delivery_rows:
        by_event.setdefault(d[0], []).append(delivery_record(d))
    return [
        EventRecord(
            id=row[0],
            event=row[1],
            job_id=row[2],
            body=bytes(row[3]),
            headers=json.loads(row[4]),
            received_at=row[5],
            state=row[6],
            deliveries=tuple(by_event.get(row[0], ())),
            snapshot=Snapshot.from_json(row[7], row[8]) if row[7] is not None else None,
            enrich_at=row[9],
            enrich_attempts=row[10],
            enrich_error=row[11],
        )
        for row in rows
    ]


@dataclass(frozen=True)
class Outcome:
    """How one delivery attempt ended, as the worker settles it.

    ``state`` is the delivery's new state; ``next_attempt_at`` is required for ``pending``.
    ``attempted`` is False for a skip, which does not count as an attempt.
    """

    state: DeliveryState
    error: str | None = None
    next_attempt_at: float | None = None
    attempted: bool = True


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
        """Store the event and its delivery rows durably; False if its id was already stored.

        Returns only after the commit: a 2xx may be sent the moment this returns.
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
    ) -> EventState:
        """Store the event's snapshot (its deliveries become claimable), settle the deliveries
        in ``finished`` (sink -> outcome: filtered out, or no longer configured) and drop the
        enrichment lease. Also replaces an older snapshot (a delivery refetched a stale one).
        ``ledger`` goes into the asset ledger in the same transaction
        (:mod:`receiver.store.asset_ledger`). Returns the event's state; raises UnknownEvent
        for an unknown id."""

    async def fail_enrichment(
        self, event_id: str, *, error: str, retry_at: float | None, now: float
    ) -> EventState:
        """Record a failed enrichment attempt, as a failed attempt of every pending delivery of
        the event too (see :func:`receiver.store.rules.enrichment_failed`): due again at
        ``retry_at``, or, when None, given up: dead with ``error``. Drops the lease; returns the
        event's state."""

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
    ) -> EventState:
        """Record the result of one delivery attempt (dropping its lease), update the event's
        state and, with ``lane``, the lane's circuit and pause. Returns the event's new state
        (so exactly one settle sees an event finish)."""

    async def lane_stats(self, *, now: float) -> dict[str, LaneStats]:
        """Backlog, oldest due time and leased count per sink (sinks with any pending)."""

    async def get(self, event_id: str) -> EventRecord | None:
        """One event with its deliveries, or None."""

    async def list(
        self, *, state: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[EventRecord]:
        """Events newest first, optionally only those in ``state``."""

    async def redeliver(self, event_id: str, *, now: float) -> int:
        """Make every non-skipped delivery of the event pending and due now (an event that never
        got its snapshot is enriched again first).

        Returns how many deliveries were reset; raises UnknownEvent for an unknown id.
        """

    async def redeliver_dead(self, *, now: float) -> int:
        """Make every dead delivery pending and due now; returns how many."""

    async def prune(self, *, older_than: float, batch: int = 1000) -> int:
        """Delete finished (``done``) events received before ``older_than``; returns how many."""

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

    async def redeliver_sink(self, event_id: str, sink: str, *, now: float) -> int:
        """Make one (non-skipped) delivery pending and due now; raises UnknownEvent for an
        unknown event or a sink the event has no delivery for. Returns 1, or 0 if skipped."""

    async def redeliver_dead_group(self, sink: str, error: str | None, *, now: float) -> int:
        """Make the dead deliveries of ``sink`` whose last error is ``error`` pending and due."""
