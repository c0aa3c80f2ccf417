"""End-to-end benchmark: events fully processed per second against a slow upstream.

The upstream stand-in (bench/stub.py) adds ``--latency`` (100 ms) to every API call. Each event
(a ``logo`` job with one asset) costs two calls in sequence (the job, then its asset), a file
download and a file written, plus one delivery to an HTTP sink when this build has the ``http``
sink type. With ``worker.concurrency`` = C events in flight, no receiver can beat
C / (2 x latency) events/s: the bound. Target: >= 0.9x the bound::

    python -m bench.e2e [--events 1200] [--concurrency 16] [--latency 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import aiohttp

from bench import backlog
from bench.common import (
    SECRET,
    WEBHOOK_PATH,
    Server,
    bench_env,
    event_loop_name,
    free_port,
    machine_note,
    python_module,
    receiver_command,
    receiver_config,
    scratch,
)
from receiver.config.sink_types import SINK_TYPES
from receiver.signature import webhook_headers

CALLS_PER_EVENT = 2  # GET /jobs/{id}, then GET /assets/{id}
TARGET_RATIO = 0.9


def sinks(stub_port: int) -> list[dict[str, Any]]:
    chosen: list[dict[str, Any]] = [
        {
            "name": "files",
            "type": "download",
            "directory": "downloads",
            "allow_private_networks": True,
        }
    ]
    if "http" in SINK_TYPES:
        chosen.append(
            {
                "name": "forward",
                "type": "http",
                "url": f"http://127.0.0.1:{stub_port}/capture",
                "secret": "whsec_bench_forward",
            }
        )
    return chosen


async def send_all(url: str, count: int, parallel: int = 32) -> float:
    """POST ``count`` signed events; returns when the first one was sent."""
    slots = asyncio.Semaphore(parallel)
    first = time.monotonic()

    async def send(session: aiohttp.ClientSession, n: int) -> None:
        body = backlog.logo_event(n)
        event = json.loads(body)
        headers = webhook_headers(
            SECRET, body, int(time.time()), event_id=event["id"], event_name=event["event"]
        )
        async with slots:
            while True:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    if response.status == 200:
                        return
                await asyncio.sleep(0.05)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(send(session, n) for n in range(count)))
    return first


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default=event_loop_name())
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    bound = args.concurrency / (CALLS_PER_EVENT * args.latency)
    print(f"bench e2e: {machine_note(args.loop)}")
    with scratch("e2e-", keep=args.keep) as work:
        stub_port = free_port()
        stub = Server(
            "stub",
            python_module(
                args.loop, "bench.stub", "--port", str(stub_port), "--latency", str(args.latency)
            ),
            port=stub_port,
            cwd=work,
            env=bench_env(),
        ).start()
        chosen = sinks(stub_port)
        print(
            f"  {args.events:,} events, worker.concurrency {args.concurrency}, upstream latency "
            f"{args.latency * 1000:.0f} ms, sinks: {', '.join(s['type'] for s in chosen)}"
            + ("" if "http" in SINK_TYPES else " (no http sink type in this build)")
        )
        port = free_port()
        config = receiver_config(
            work,
            port=port,
            admin_port=free_port(),
            base_url=f"http://127.0.0.1:{stub_port}/v1",
            sinks=chosen,
            worker={"concurrency": args.concurrency},
        )
        receiver = Server(
            "receiver",
            receiver_command(config, "all", args.loop),
            port=port,
            cwd=work,
            env=bench_env(),
        )
        try:
            receiver.start()
            first = asyncio.run(send_all(f"http://127.0.0.1:{port}{WEBHOOK_PATH}", args.events))
            sent = time.monotonic() - first
            db = work / "inbox.db"
            while backlog.pending(db) > 0:
                time.sleep(0.05)
            took = time.monotonic() - first
        finally:
            receiver.stop()
            stub.stop()
        states = dict(backlog.iter_states(db))
        files = sum(1 for _ in (work / "downloads").rglob("*.png"))
    rate = args.events / took
    ratio = rate / bound
    print(f"  webhooks sent in {sent:.1f} s; all processed after {took:.1f} s; states {states}")
    print(f"  {files:,} files written")
    print(
        f"  {rate:,.1f} events/s processed; bound {bound:,.1f} events/s "
        f"(concurrency {args.concurrency} / ({CALLS_PER_EVENT} calls x {args.latency:g} s))"
    )
    verdict = "PASS" if ratio >= TARGET_RATIO else "MISS"
    print(f"{verdict}  {ratio:.2f}x the bound (target >= {TARGET_RATIO})")
    print(f"\n  {machine_note(args.loop)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
