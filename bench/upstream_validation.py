"""What checking fetched answers costs: its share of the CPU an event's enrichment takes.

Each round enriches ``--events`` events the way the workers do (``Enricher.fetch``: the job and
its two assets fetched over HTTP from bench/stub.py, which runs as its own process so that its
CPU is not counted here), then checks the same job and two assets ``--events`` times the way the
API client does after each fetch (``receiver.upstream.conformance.checked``). Both are measured
in this process's CPU time; the enrichment's includes its own checks, so the ratio is the share
of an event's enrichment spent checking. Rounds alternate; medians are printed, and the exit
status is 1 when the share is above ``--limit`` (5 %)::

    python -m bench.upstream_validation [--events 300] [--rounds 5] [--limit 0.05]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from typing import Any

import aiohttp

from bench.common import Server, bench_env, free_port, python_module, scratch
from receiver.cli.common import quiet_logs
from receiver.delivery.enrich import Enricher
from receiver.store.records import EventRecord
from receiver.upstream.client import UpstreamClient
from receiver.upstream.conformance import baseline_checks, checked


def record(job_id: str) -> EventRecord:
    body = {
        "id": str(uuid.uuid4()),
        "object": "event",
        "event": "job.completed",
        "job_id": job_id,
        "asset_ids": {"image": f"ast-{job_id}-a", "transparent_image": f"ast-{job_id}-b"},
    }
    return EventRecord(
        id=body["id"],
        event="job.completed",
        job_id=job_id,
        body=json.dumps(body).encode(),
        headers={},
        received_at=time.time(),
        state="pending",
    )


async def enrich_round(enricher: Enricher, events: int) -> tuple[float, Any]:
    """CPU seconds for ``events`` enrichments; the last snapshot (for the checking round)."""
    records = [record(str(uuid.uuid4())) for _ in range(events)]
    started = time.process_time()
    snapshot = None
    for rec in records:
        snapshot = await enricher.fetch(rec)
    return time.process_time() - started, snapshot


def check_round(job: dict[str, Any], assets: list[dict[str, Any]], events: int) -> float:
    """CPU seconds for checking one job and its assets ``events`` times."""
    started = time.process_time()
    for _ in range(events):
        checked("job", job, None)
        for asset in assets:
            checked("asset", asset, None)
    return time.process_time() - started


async def measure(base_url: str, events: int, rounds: int) -> tuple[list[float], list[float]]:
    baseline_checks()  # compiled once per process, as in the receiver: not part of a round
    enrich: list[float] = []
    check: list[float] = []
    async with aiohttp.ClientSession() as session:
        client = UpstreamClient(session=session, base_url=base_url, api_key="bench", timeout=10)
        enricher = Enricher(client, clock=time.time)
        await enrich_round(enricher, 20)  # warm-up: connections, caches
        for _ in range(rounds):
            seconds, snapshot = await enrich_round(enricher, events)
            enrich.append(seconds / events)
            job, assets = dict(snapshot.job), [dict(a) for a in snapshot.assets]
            assert len(assets) == 2 and not baseline_checks()["job"].problems(job), job
            check.append(check_round(job, assets, events) / events)
    return enrich, check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.upstream_validation", description=__doc__
    )
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--limit", type=float, default=0.05, help="the largest share allowed")
    args = parser.parse_args(argv)
    quiet_logs()  # the client's debug line per request is not what is measured
    with scratch("validation-") as work:
        port = free_port()
        stub = Server(
            "stub",
            python_module("asyncio", "bench.stub", "--port", str(port)),
            port=port,
            cwd=work,
            env=bench_env(),
        ).start()
        with stub:
            enrich, check = asyncio.run(
                measure(f"http://127.0.0.1:{port}/v1", args.events, args.rounds)
            )
    per_event, checking = statistics.median(enrich), statistics.median(check)
    share = checking / per_event
    print(
        f"bench upstream validation: {args.events} events x {args.rounds} rounds; CPU per event: "
        f"enrichment (a job and 2 assets fetched, checks included) {per_event * 1e6:.0f} us, "
        f"checking the job and 2 assets {checking * 1e6:.1f} us: {share:.1%} of it "
        f"(limit {args.limit:.0%})"
    )
    return 0 if share <= args.limit else 1


if __name__ == "__main__":
    raise SystemExit(main())
