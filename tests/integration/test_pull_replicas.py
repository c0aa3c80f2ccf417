"""Two receivers on one Postgres inbox follow one watch list: no job is ever long-polled by
both at once (the simulator counts the long-polls in flight per job), both take a share of the
work, and each watched job's outcome is stored once."""

from __future__ import annotations

import asyncio
import random

import pytest
from structlog.testing import capture_logs

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.simulator import Simulator
from tests.support.helpers import wait_for
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres

API_KEY = "service_" + "5e" * 32
JOBS = 24


@pytest.fixture
async def upstream(aiohttp_server):
    sim = Simulator(api_key=API_KEY, seed=23)
    server = await aiohttp_server(sim.create_app())
    sim.base_url = str(server.make_url("/v1"))
    return sim


def replica_settings(upstream, schema):
    return parse_settings(
        {
            "webhook": {"secrets": ["whsec_pull_replicas"]},
            "api": {"base_url": upstream.base_url, "api_key": API_KEY, "timeout_seconds": 5},
            "store": {"url": POSTGRES_URL, "schema": schema, "pool_size": 4},
            "worker": {"poll_interval_seconds": 0.05},
            # Neither replica can hold every job, but together they could poll some twice.
            "pull": {"wait_seconds": 1, "concurrency": JOBS * 2 // 3},
        },
        env={},
    )


async def test_two_replicas_never_poll_the_same_job_at_once(upstream):
    require_postgres()
    sim = upstream
    async with fresh_schema() as schema:
        settings = replica_settings(sim, schema)
        jobs = [sim.add_job("logo", status="processing")["job_id"] for _ in range(JOBS)]
        with capture_logs():
            async with (
                Runtime(settings, role="worker") as one,
                Runtime(settings, role="worker") as two,
            ):
                await one.store.add_watches(jobs, now=one.clock(), expires_at=one.clock() + 600)
                one.wake_poller()
                two.wake_poller()

                async def every_job_polled_twice() -> bool:
                    return all(sim.long_polls[job_id] >= 2 for job_id in jobs)

                await wait_for(every_job_polled_twice, 30, what="two long-polls of every job")
                finishing = jobs[:]
                random.Random(5).shuffle(finishing)
                for job_id in finishing:
                    sim.complete_job(job_id)
                    await asyncio.sleep(0.02)

                async def all_done() -> bool:
                    watches = await one.store.list_watches(limit=1000)
                    return all(w.state == "done" for w in watches)

                await wait_for(all_done, 30, what="every watch done")
                events = await one.store.list(limit=1000)
                polls = [
                    runtime.metrics.registry.get_sample_value(
                        "receiver_upstream_requests_total",
                        {"endpoint": "/jobs/{id}", "status": "200"},
                    )
                    or 0
                    for runtime in (one, two)
                ]

    assert max(sim.max_long_polls_in_flight[job_id] for job_id in jobs) == 1
    assert sorted(e.job_id for e in events) == sorted(jobs)
    assert all(e.payload()["source"] == "poll" for e in events)
    assert all(count > 0 for count in polls), polls  # both replicas took a share
