"""Before ``--until-done`` stops the API: wait for the receiver to fetch what it was told about.

A 2xx means the receiver has *stored* an event; it fetches the job and its assets afterwards
(the contract: ``GET /jobs/{id}``, then ``GET /assets/{id}`` for each asset id a
``job.completed`` names, then the files). Stopping the API at the last 2xx would leave those fetches
failing and the events retrying, or dead. So the simulation keeps serving until every delivered
event's job (finished) and assets (completed) have been fetched and the API has been quiet for
:data:`QUIET_SECONDS` (the file downloads that follow), or until the API has been quiet for
:data:`IDLE_SECONDS` with some never fetched (a receiver skips the events none of its sinks
wants, and an intake-only one fetches nothing), or until the grace period runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from receiver.logs import get_logger
from receiver.simulator.sender import WebhookSender
from receiver.simulator.state import SimulatorState

log = get_logger("receiver.simulator")

#: No request for this long after the last needed fetch: the receiver has what it needs.
QUIET_SECONDS = 1.0
#: No request at all for this long: the receiver wants nothing more, whatever is unfetched.
IDLE_SECONDS = 5.0
DEFAULT_GRACE_SECONDS = 30.0


def unfetched(sim: SimulatorState, sender: WebhookSender) -> int:
    """Delivered events whose job or assets the receiver has not fetched yet."""
    delivered = {d.event_id for d in sender.deliveries if d.state == "delivered"}
    missing = 0
    for job in sim.jobs.values():
        if job.event_id not in delivered:
            continue
        needs = [f"job:{job.id}"]
        if job.outcome != "failed":
            # The assets its webhook named (a body may name none: then the job's urls serve).
            named = sim.payload_for(job.id).get("asset_ids") or {}
            needs += [f"asset:{asset_id}" for asset_id in named.values()]
        if not sim.fetched.issuperset(needs):
            missing += 1
    return missing


async def wait_for_fetches(
    sim: SimulatorState,
    sender: WebhookSender,
    *,
    grace: float,
    stop: asyncio.Event,
    quiet: float = QUIET_SECONDS,
    idle: float = IDLE_SECONDS,
) -> int:
    """Wait as the module docstring says; returns how many events still lack a fetch."""
    started = time.monotonic()
    deadline = started + grace
    missing = unfetched(sim, sender)
    if missing:
        log.info(
            "every delivery settled; waiting for the receiver to fetch jobs and assets",
            events=missing,
            grace_seconds=grace,
        )
    while not stop.is_set():
        now = time.monotonic()
        missing = unfetched(sim, sender)
        silent = now - max(sim.last_request_at, started)
        if not missing and silent >= quiet:
            return 0
        if silent >= idle:
            log.info(
                "the receiver has not fetched every delivered event's job, and has been idle "
                "(it skips the events none of its sinks wants)",
                events=missing,
                idle_seconds=idle,
            )
            return missing
        if now >= deadline:
            if missing:
                log.warning(
                    "stopping the API before the receiver fetched every delivered event's job "
                    "and assets (raise --grace to wait longer)",
                    events=missing,
                    grace_seconds=grace,
                )
            return missing
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)
    return unfetched(sim, sender)
