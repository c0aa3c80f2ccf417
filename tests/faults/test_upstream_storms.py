"""Upstream storms: 30% of API calls refused (429 with or without Retry-After, or 5xx) for the
equivalent of several minutes, time-scaled: the backoff runs at 1/50 of its production scale.

Every event completes once the storm passes, and the receiver never hammers the upstream: each
delivery's attempts fit the backoff schedule for the time it took, and every job request the
upstream saw is one of those counted attempts (no hidden retry loop).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from receiver.app import Runtime
from receiver.simulator import Simulator
from receiver.upstream.client import ASSET_ENDPOINT, JOB_ENDPOINT
from tests.support.expect import expected_files
from tests.support.faults import API_KEY, SECRET, final_files, signed_post
from tests.support.helpers import wait_for
from tests.support.pipeline import download_settings

INITIAL = 0.02  # production: 1 s
MAXIMUM = 0.32  # production: 600 s
STORM_SECONDS = 3.0  # 150 initial backoffs: minutes at production scale
EVENTS = 30


def min_wait(failures: int, floor: float) -> float:
    """The shortest wait RetryPolicy allows after the ``failures``-th failed attempt."""
    base = min(MAXIMUM, INITIAL * 2 ** (failures - 1))
    return max(base / 2, floor)


def most_attempts(elapsed: float, floor: float) -> int:
    """How many attempts the schedule allows in ``elapsed`` seconds (the first one is free)."""
    attempts, waited = 1, 0.0
    while waited + min_wait(attempts, floor) <= elapsed:
        waited += min_wait(attempts, floor)
        attempts += 1
    return attempts


STORMS = {
    "429 with Retry-After": {"rate_limit_fraction": 0.3, "retry_after": 1},
    "429 without Retry-After": {"rate_limit_fraction": 0.3, "retry_after": None},
    "5xx": {"error_fraction": 0.3, "error_status": 503},
}


@pytest.mark.parametrize("storm", list(STORMS))
async def test_storm_ends_with_every_event_done_and_no_hot_loop(
    storm: str, aiohttp_client: Any, tmp_path: Path, upstream: Simulator
) -> None:
    settings = download_settings(
        upstream,
        tmp_path,
        secret=SECRET,
        api_key=API_KEY,
        worker={
            "concurrency": 8,
            "max_attempts": 1000,
            "backoff_initial_seconds": INITIAL,
            "backoff_max_seconds": MAXIMUM,
        },
    )
    for knob, value in STORMS[storm].items():
        setattr(upstream, knob, value)
    payloads = [upstream.add_job("image") for _ in range(EVENTS)]
    async with Runtime(settings) as runtime:
        client = await aiohttp_client(runtime.public_app())
        storm_began = time.monotonic()
        for payload in payloads:
            body, headers = signed_post(payload)
            response = await client.post("/webhooks", data=body, headers=headers)
            assert response.status == 200
        await asyncio.sleep(STORM_SECONDS - (time.monotonic() - storm_began))
        refused_in_storm = sum(
            runtime.metrics.registry.get_sample_value(
                "receiver_upstream_requests_total", {"endpoint": endpoint, "status": status}
            )
            or 0
            for endpoint in (JOB_ENDPOINT, ASSET_ENDPOINT)
            for status in ("429", "503")
        )
        upstream.rate_limit_fraction = upstream.error_fraction = 0.0

        async def all_done() -> bool:
            counts, _ = await runtime.store.counts()
            return counts == {"pending": 0, "done": EVENTS, "dead": 0}

        await wait_for(all_done, 30, 0.05, "every event done after the storm")
        records = [await runtime.store.get(p["id"]) for p in payloads]

    floor = 1.0 if STORMS[storm].get("retry_after") else 0.0
    # With Retry-After the client asks nothing more until then: a few refusals a second at most.
    least = STORM_SECONDS if floor else EVENTS / 2
    assert refused_in_storm >= least, "the storm refused almost nothing: it tested nothing"
    assert final_files(tmp_path / "dl") == expected_files(upstream, payloads)
    attempts = []
    for record in records:
        assert record is not None
        (delivery,) = record.deliveries
        elapsed = delivery.updated_at - record.received_at
        attempts.append(delivery.attempts)
        assert delivery.attempts <= most_attempts(elapsed, floor), (
            f"{delivery.attempts} attempts in {elapsed:.2f} s break the backoff schedule"
        )
    # Every job request the upstream answered is one counted attempt: nothing retries unseen.
    # (After a 429 with Retry-After the client sends nothing until then: an attempt made
    # meanwhile counts, but never reaches the upstream.)
    requests = upstream.requests["GET /v1/jobs/{id}"]
    assert requests <= sum(attempts) if floor else requests == sum(attempts)
    assert max(attempts) > 1
