"""An inbox holding something of every kind, put there through the store's own API (any backend):
events in every state (new, claimed, retrying, in flight, done, dead, skipped, a failed fetch),
odd ids and a body that is not UTF-8, the timeline, both ledgers, watches (one leased), lanes
with a pause, a running and a cancelled redelivery batch.

Every pending delivery is due, so a receiver started on the inbox (or a copy of it) sends each
one at once; only the events with deliveries left pending need their job from the upstream.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable
from typing import Any

from receiver.delivery.redelivery import start
from receiver.store import NewEvent, Outcome, Store
from receiver.store.asset_ledger import LedgerEntry
from receiver.store.batches import RedeliveryFilter
from receiver.store.lanes_model import LanePolicy
from receiver.store.records import Snapshot
from receiver.store.steps import Step
from tests.support.store_cases import ODD_IDS

SINKS = ("hook", "spare")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
OWNER = "source-worker"  # the receiver of the source that holds leases
LEASE = 600.0
NOT_UTF8 = b"\xff\xfe\x00 not utf-8 \x80"

#: Makes a job (at the upstream, when there is one): its webhook payload.
NewJob = Callable[[], dict[str, Any]]


def offline_job() -> dict[str, Any]:
    """A job's webhook payload, for an inbox no receiver will process."""
    return {
        "id": str(uuid.uuid4()),
        "object": "event",
        "event": "job.completed",
        "job_id": f"job-{uuid.uuid4()}",
        "type": "image",
    }


class Filler:
    def __init__(self, store: Store, now: float, new_job: NewJob) -> None:
        self.store = store
        self.now = now
        self.new_job = new_job
        self.payloads: dict[str, dict[str, Any]] = {}

    async def event(self, event_id: str, *, body: bytes | None = None, **fields: Any) -> str:
        payload = {**self.new_job(), "id": event_id}
        self.payloads[event_id] = payload
        new = NewEvent(
            id=event_id,
            event=payload["event"],
            job_id=payload["job_id"],
            body=body if body is not None else json.dumps(payload).encode(),
            headers={"Service-Event-Id": event_id, "Content-Type": "application/json"},
            received_at=self.now,
            sinks=SINKS,
        )
        assert await self.store.add_event(dataclasses.replace(new, **fields))
        return event_id

    def snapshot(self, event_id: str) -> Snapshot:
        job = {
            "id": self.payloads[event_id]["job_id"],
            "status": "completed",
            "type": "image",
            "urls": {},
        }
        return Snapshot(job=job, assets=(), fetched_at=self.now)

    async def enriched(self, event_id: str, **extra: Any) -> str:
        await self.event(event_id)
        await self.store.save_snapshot(
            event_id, self.snapshot(event_id), now=self.now, steps=[self.step("", 1)], **extra
        )
        return event_id

    def step(self, sink: str, attempt: int, outcome: str = "delivered") -> Step:
        return Step(
            kind="attempt" if sink else "upstream",
            sink=sink,
            name=sink or "GET /jobs/{id}",
            attempt=attempt,
            started_at=self.now - 0.5,
            ended_at=self.now - 0.25,
            outcome=outcome if sink else "200",
            error=None if outcome == "delivered" else "HTTP 500",
            status=200 if outcome == "delivered" else 500,
        )

    async def settle(self, event_id: str, sink: str, outcome: Outcome) -> None:
        delivered = "delivered" if outcome.state == "done" else "retry"
        await self.store.settle(
            event_id, sink, outcome, now=self.now, steps=[self.step(sink, 1, delivered)]
        )


async def fill(store: Store, *, now: float, new_job: NewJob = offline_job) -> dict[str, Any]:
    """Put everything in ``store`` (empty, open); the webhook payload of each event, by id."""
    f = Filler(store, now, new_job)
    done, dead = Outcome("done"), Outcome("dead", error="HTTP 500")

    # Claimed by a receiver of the source: its enrichment lease, then its deliveries' leases.
    await f.event("ev-claimed")
    [claimed] = await store.claim_enrichment(owner=OWNER, limit=1, lease_seconds=LEASE, now=now)
    assert claimed.id == "ev-claimed"
    await f.enriched("ev-in-flight")
    got = await store.claim_deliveries(
        LanePolicy("hook", rate=50.0, burst=10.0),
        owner=OWNER,
        limit=10,
        lease_seconds=LEASE,
        now=now,
    )
    assert [d.event.id for d in got.deliveries] == ["ev-in-flight"]

    await f.event("ev-new", trace=TRACEPARENT)
    await f.event("ev-polled", source="poll")
    await store.fail_enrichment(
        "ev-polled", error="HTTP 503", retry_at=now - 1, now=now, steps=[f.step("", 1)]
    )
    await f.enriched("ev-retrying")
    await f.settle("ev-retrying", "hook", Outcome("pending", error="timeout", next_attempt_at=now))
    await f.settle("ev-retrying", "spare", done)

    ledger = [LedgerEntry("asset ast-1"), LedgerEntry("item it-1 image", now - 60)]
    for event_id in ("ev-done", *ODD_IDS):
        await f.enriched(event_id, ledger=ledger if event_id == "ev-done" else ())
        for sink in SINKS:
            await f.settle(event_id, sink, done)
    await f.event("ev-binary", body=NOT_UTF8)
    await store.save_snapshot("ev-binary", f.snapshot("ev-binary"), now=now)
    for sink in SINKS:
        await f.settle("ev-binary", sink, done)
    await f.enriched("ev-skipped", finished={"spare": Outcome("skipped", attempted=False)})
    await f.settle("ev-skipped", "hook", done)

    for event_id in ("ev-dead", "ev-withdrawn"):
        await f.enriched(event_id)
        await f.settle(event_id, "hook", dead)
        await f.settle(event_id, "spare", done)
    # A running batch (ev-dead's hook delivery queued again) and a cancelled one (withdrawn).
    running = RedeliveryFilter(status="dead", event_id="ev-dead")
    await start(store, running, created_by="tests", now=now)
    cancelled = await start(
        store, RedeliveryFilter(status="dead", event_id="ev-withdrawn"), created_by="t", now=now
    )
    await store.cancel_redelivery(cancelled.id, now=now)

    # Watches of jobs the upstream does not know: one leased, one ended, one waiting.
    jobs = [f"watched-{n}-{uuid.uuid4()}" for n in range(3)]
    await store.add_watches(jobs, now=now, expires_at=now + 3600)
    _leased, ended = await store.claim_watches(owner=OWNER, limit=2, lease_seconds=LEASE, now=now)
    await store.settle_watch(ended.job_id, owner=OWNER, state="not_found", now=now)
    await store.pause_lane("idle", until=None, reason="maintenance drill", now=now)
    await store.pause_lane("later", until=now + 3600, reason=None, now=now)
    return f.payloads
