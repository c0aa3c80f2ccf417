"""bench-redeliver: a redelivery batch over a million stored deliveries, on SQLite and Postgres.

An inbox is filled in bulk with ``--count`` events whose delivery to the ``hook`` sink is dead
(their job already fetched), and ``receiver serve`` runs on it with that sink paced at ``--rate``
a second. Rounds of wrk against its public listener, each ``--seconds`` long:

- *idle* (``--rounds`` of them): nothing else happening;
- *queuing* (``--rounds``): the lane paused (``POST /admin/lanes/hook/pause``), as
  docs/incidents.md has an operator do, and ``POST /admin/redeliveries`` started the batch: its
  steps running, what the batch itself costs;
- *sending* (``--rounds``): once everything was queued, the lane resumed, sending the batch at
  its rate: what delivering costs, as for any event (a batch is queued while its lane sends when
  the lane is not paused: then both costs at once).

Printed: the time to queue the whole batch, intake's rate in each round and its ratio to the
median idle round (the goal: >= 0.9x while queuing), and the lane's rate as the sink saw it (the
most requests in any one second, and the average) against its limit. Numbers, not assertions::

    python -m bench.redeliver [--count 1000000] [--stores sqlite,postgres] [--rate 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import urllib.error
import urllib.request
from contextlib import closing
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.backlog import new_inbox
from bench.common import (
    Server,
    Table,
    bench_env,
    free_port,
    machine_note,
    receiver_command,
    receiver_config,
    run_wrk,
    scratch,
    write_requests,
)
from bench.scale import postgres as pg
from tests.support.peers import Capture

POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
# The stored events are job.failed, the only event the hook sink takes; wrk's webhooks are
# job.completed, which no sink takes: they measure intake alone (stored, nothing to fetch or send),
# not workers fetching jobs for them beside the batch.
STORED_EVENT = "job.failed"
SNAPSHOT = '{"job":{"id":"job","status":"failed","type":"logo"},"assets":[]}'

SQLITE_FILL = """
WITH RECURSIVE n (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :count),
ids (i, id) AS (SELECT i, printf('%08x-%08d', (i * 2654435761) % 4294967296, i) FROM n)
INSERT INTO events (id, event, job_id, body, headers, received_at, state, snapshot, fetched_at)
SELECT id, 'job.failed', 'job-' || id,
       CAST('{"id":"' || id || '","object":"event","event":"job.failed","job_id":"job-' || id
            || '"}' AS BLOB),
       '{}', :now - 3600 + i * 0.001, 'dead', :snapshot, :now
FROM ids
"""
DEAD_DELIVERIES = """
INSERT INTO deliveries (event_id, sink, state, attempts, next_attempt_at, last_error, updated_at)
SELECT id, 'hook', 'dead', 12, NULL, 'HTTP 503', received_at FROM events
"""
# bench-scale's done events (bench/scale/postgres.py), made dead letters of the hook sink.
POSTGRES_DEAD = (
    "UPDATE events SET state = 'dead', snapshot = $1, fetched_at = extract(epoch FROM now()),"
    " event = 'job.failed',"
    ' body = convert_to(\'{"id":"\' || id || \'","object":"event","event":'
    '"job.failed","job_id":"\' || job_id || \'"}\', \'UTF8\')',
    "UPDATE deliveries SET sink = 'hook', state = 'dead', attempts = 12, last_error = 'HTTP 503'",
    "VACUUM ANALYZE",
)


def sqlite_inbox(work: Path, count: int) -> dict[str, Any]:
    path = work / "inbox.db"
    started = time.monotonic()
    with closing(new_inbox(path)) as conn:
        params = {"count": count, "now": time.time(), "snapshot": SNAPSHOT}
        conn.execute("BEGIN")
        conn.execute(SQLITE_FILL, params)
        conn.execute(DEAD_DELIVERIES)
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    print(f"  sqlite inbox: {count:,} dead deliveries in {time.monotonic() - started:.0f} s")
    return {"url": f"sqlite:///{path}", "synchronous": "full"}


def postgres_inbox(work: Path, count: int) -> dict[str, Any]:
    started = time.monotonic()
    schema = pg.build(POSTGRES_URL, count, work, progress=lambda line: print(line))
    statements: list[tuple[str, tuple[object, ...]]] = [(POSTGRES_DEAD[0], (SNAPSHOT,))]
    statements += [(s, ()) for s in POSTGRES_DEAD[1:]]
    asyncio.run(pg._run(POSTGRES_URL, schema, statements))
    print(
        f"  postgres schema {schema}: {count:,} dead deliveries in "
        f"{time.monotonic() - started:.0f} s"
    )
    return {"url": POSTGRES_URL, "schema": schema}


def admin(port: int, path: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=data,
        method="POST" if data is not None else "GET",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def resume(port: int) -> None:
    """Resume the hook lane. Its answer shows the lane's backlog, which Postgres counts over
    every pending delivery (seconds with a million, more before its statistics catch up with
    the batch): the store's 5 s statement timeout may answer 503 after the lane resumed."""
    for _attempt in range(5):
        try:
            admin(port, "/admin/lanes/hook/resume", {})
            return
        except urllib.error.HTTPError as exc:
            if exc.code != 503:
                raise
            print("    resume answered 503 (the lane's backlog not counted in time); again")
            time.sleep(5)
    raise RuntimeError("the hook lane could not be resumed")


async def serve_capture(capture: Capture) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(capture.app(), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}/hook"


async def wrk_round(args: argparse.Namespace, work: Path, port: int, name: str) -> float:
    host = f"127.0.0.1:{port}"
    prefix = write_requests(work, name, args.requests, threads=args.threads, host=host)
    result = await asyncio.to_thread(
        run_wrk,
        f"http://{host}/webhooks",
        prefix,
        threads=args.threads,
        connections=args.connections,
        seconds=args.seconds,
    )
    if result.failures:
        print(f"    {name}: {result.failures} requests failed")
    return result.rps


def against(rates: list[float], base: float) -> str:
    """Rounds' median rate, its ratio to ``base`` and each round's."""
    each = ", ".join(f"{r / base:.2f}" for r in rates)
    return (
        f"{statistics.median(rates):,.0f} ({statistics.median(rates) / base:.2f}x; rounds {each})"
    )


async def run_store(args: argparse.Namespace, kind: str, table: Table) -> None:
    with scratch(f"redeliver-{kind}-") as work:
        # (in a thread: building a Postgres schema runs its own event loop)
        builder = sqlite_inbox if kind == "sqlite" else postgres_inbox
        store = await asyncio.to_thread(builder, work, args.count)
        capture = Capture()
        runner, url = await serve_capture(capture)
        public, ops = free_port(), free_port()
        sink = {"name": "hook", "type": "http", "url": url, "secret": "h" * 24}
        sink["events"] = [STORED_EVENT]
        config = receiver_config(
            work,
            port=public,
            admin_port=ops,
            store=store,
            sinks=[{**sink, "rate_limit_per_second": args.rate}],
            worker={"job_max_age_seconds": 1e9},
        )
        server = Server(
            "receiver", receiver_command(config, "all"), port=ops, cwd=work, env=bench_env()
        )
        try:
            server.start(timeout=120)

            async def rounds(name: str) -> list[float]:
                return [
                    await wrk_round(args, work, public, f"{name}{i}") for i in range(args.rounds)
                ]

            idle = await rounds("idle")
            admin(ops, "/admin/lanes/hook/pause", {"reason": "bench: queue first"})
            started = time.monotonic()
            batch = admin(ops, "/admin/redeliveries", {"status": "dead", "sinks": ["hook"]})
            made = time.monotonic() - started
            queuing = await rounds("queuing")
            shown = admin(ops, f"/admin/redeliveries/{batch['id']}")
            print(f"    after the queuing rounds: {shown['queued']:,} queued")
            while (shown := admin(ops, f"/admin/redeliveries/{batch['id']}"))["queued_at"] is None:
                if time.monotonic() - started > args.timeout:
                    break
                await asyncio.sleep(5)
            queued_in = time.monotonic() - started if shown["queued_at"] else None
            print(f"    all queued in {queued_in or 0:.0f} s; {shown['queued']:,} queued")
            sent_before = len(capture.times)
            resume(ops)
            sending = await rounds("sending")
            times = capture.times[sent_before:]
            window = (times[-1] - times[0]) if len(times) > 1 else 0.0
            most = max(
                (sum(1 for u in times if t <= u < t + 1.0) for t in times[-4000:]), default=0
            )
            base = statistics.median(idle)
            table.add(
                kind,
                f"{shown['matched']:,}",
                f"{made:.1f} s",
                f"{queued_in:.0f} s" if queued_in else f"> {args.timeout:.0f} s",
                " / ".join(f"{r:,.0f}" for r in idle),
                against(queuing, base),
                against(sending, base),
                f"{most} / {args.rate:g}",
                f"{(len(times) - 1) / window:.1f}" if window else "-",
            )
            admin(ops, f"/admin/redeliveries/{batch['id']}/cancel", {})
        except Exception:
            print(server.log())
            raise
        finally:
            server.stop()
            await runner.cleanup()
            if kind == "postgres":
                await asyncio.to_thread(pg.drop, POSTGRES_URL, store["schema"])
            print(table.render())


async def bench(args: argparse.Namespace) -> int:
    table = Table(
        [
            "store",
            "matched",
            "batch stored",
            "all queued",
            "intake idle (req/s, each round)",
            "while queuing (lane paused)",
            "while sending (lane at its rate)",
            "lane: most in 1 s / limit",
            "lane: mean/s",
        ]
    )
    for kind in args.stores.split(","):
        if kind == "postgres" and not pg.reachable(POSTGRES_URL):
            print("  postgres: not reachable on 127.0.0.1:5432, skipped")
            continue
        print(f"{kind}: {args.count:,} dead deliveries, the hook lane at {args.rate:g}/s")
        await run_store(args, kind, table)
    print()
    print(table.render())
    print(f"({machine_note()}; wrk {args.seconds:g} s a round, {args.connections} connections)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench-redeliver", description=__doc__)
    parser.add_argument("--count", type=int, default=1_000_000, help="dead deliveries stored")
    parser.add_argument("--stores", default="sqlite,postgres", help="sqlite, postgres or both")
    parser.add_argument("--rate", type=float, default=200.0, help="the hook lane's rate limit")
    parser.add_argument("--seconds", type=float, default=15.0, help="each wrk round")
    parser.add_argument("--rounds", type=int, default=3, help="idle rounds, then queuing rounds")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requests", type=int, default=60_000, help="signed requests a round")
    parser.add_argument("--timeout", type=float, default=1800.0, help="the longest queuing wait")
    return asyncio.run(bench(parser.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
