"""Scale benchmark: intake with a million events stored, and draining a large backlog.

1. Ingest rate of ``receiver serve --role intake`` on an inbox already holding ``--stored``
   processed events (1,000,000) against one on an empty inbox (fresh every round), alternating,
   wrk as in bench/ingest. Target: within 10% (ratio >= 0.9). On SQLite, then on Postgres
   (``$RECEIVER_BENCH_POSTGRES_URL`` as in bench/ingest; left out when it does not answer; the
   stored events are generated in a schema of the run's, see bench/scale/postgres.py).
2. Drain a backlog of ``--backlog`` pending events (100,000) with ``--role worker`` through the
   fast upstream stand-in (bench/stub.py) and one download sink: the time it takes and the
   receiver's peak RSS (target: <= 120 MB; the backlog is never loaded into memory).
3. Intake while retention prunes ``--stored`` expired events, against a baseline that keeps
   them, alternating: req/s >= 0.9x and p99 <= 1.5x, and the prune rate (bench/scale/prune.py).

The SQLite inboxes are built once and cached under .bench/cache::

    python -m bench.scale [--stored 1000000] [--backlog 100000] [--rounds 3] [--seconds 10]
        [--stores sqlite,postgres] [--only ingest|drain|prune]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench import backlog
from bench.common import (
    Server,
    Table,
    WrkResult,
    bench_env,
    event_loop_name,
    free_port,
    machine_note,
    median,
    need_wrk,
    read_toml,
    receiver_command,
    receiver_config,
    scratch,
    start_stub,
)
from bench.ingest.__main__ import POSTGRES_URL, Runner
from bench.ingest.report import spread
from bench.proc import peak_rss_mb, rss_mb
from bench.scale import postgres, prune

TARGET_RATIO = 0.9
TARGET_RSS_MB = 120.0


def intake_server(
    work: Path, name: str, db: str, loop: str, store: dict[str, str] | None = None
) -> Server:
    directory = work / name
    directory.mkdir(exist_ok=True)
    port = free_port()
    config = receiver_config(directory, port=port, admin_port=free_port(), db=db, store=store)
    command = receiver_command(config, "intake", loop)
    return Server(name, command, port=port, cwd=directory, env=bench_env())


def ingest_at_scale(args: argparse.Namespace, work: Path, kind: str) -> dict[str, float]:
    print(f"\n1. intake with {args.stored:,} events stored vs an empty inbox, on {kind}")
    work = work / kind
    work.mkdir()
    schemas: list[str] = []
    full_store: dict[str, str] | None = None
    if kind == "postgres":
        schemas.append(postgres.build(POSTGRES_URL, args.stored, work))
        full_store = {"url": POSTGRES_URL, "schema": schemas[0]}
        print(postgres.cache_note(POSTGRES_URL, schemas[0]), flush=True)
    else:
        full_db = work / "full" / "inbox.db"
        full_db.parent.mkdir()
        backlog.cached_copy(
            f"inbox-{args.stored}-done.db",
            args.stored,
            full_db,
            state="done",
            body=backlog.image_event,
        )
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    pool_dir = Path(tempfile.mkdtemp(prefix="receiver-bench-", dir=shm))
    runner = Runner(args, pool_dir)
    runner.database_cpu = kind == "postgres"
    results: dict[str, list[WrkResult]] = {"empty": [], "full": []}
    full = intake_server(work, "full", "inbox.db", args.loop, full_store).start()
    try:
        runner.measure("full", full, args.warmup)
        for index in range(args.rounds):
            empty_dir = work / "empty"
            shutil.rmtree(empty_dir, ignore_errors=True)
            empty_store = None
            if kind == "postgres":  # a new schema, which the receiver creates
                schemas.append("receiver_scale_" + uuid.uuid4().hex[:12])
                empty_store = {"url": POSTGRES_URL, "schema": schemas[-1]}
            empty = intake_server(work, "empty", "inbox.db", args.loop, empty_store).start()
            try:
                runner.measure("empty", empty, args.warmup)
                order = [("empty", empty), ("full", full)]
                for name, server in order if index % 2 == 0 else order[::-1]:
                    result = runner.measure(name, server, args.seconds)
                    results[name].append(result)
                    print(
                        f"  round {index + 1} {name:<6} {result.rps:>8,.0f} req/s  "
                        f"p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms  "
                        f"non-2xx {result.failures}  {result.cpu_text()}",
                        flush=True,
                    )
            finally:
                empty.stop()
    finally:
        full.stop()
        shutil.rmtree(pool_dir, ignore_errors=True)
        for schema in schemas:
            postgres.drop(POSTGRES_URL, schema)
    columns = ["inbox", "req/s median (min-max)", "p50 ms", "p99 ms", "non-2xx"]
    columns += ["receiver CPU us/req", "database CPU us/req"]
    table = Table(columns if kind == "postgres" else columns[:-1])
    for name, runs in results.items():
        table.add(
            f"{args.stored:,} stored" if name == "full" else "empty",
            spread([r.rps for r in runs]),
            spread([r.p50_ms for r in runs], "{:.1f}"),
            spread([r.p99_ms for r in runs], "{:.1f}"),
            sum(r.failures for r in runs),
            spread([r.cpu_us for r in runs]),
            *([spread([r.db_cpu_us or 0.0 for r in runs])] if kind == "postgres" else []),
        )
    print(table.render())
    ratios = [f.rps / e.rps for f, e in zip(results["full"], results["empty"], strict=True)]
    ratio = median(ratios)
    cpu = [f.cpu_us / e.cpu_us for f, e in zip(results["full"], results["empty"], strict=True)]
    db_cpu = [
        f.db_cpu_us / e.db_cpu_us
        for f, e in zip(results["full"], results["empty"], strict=True)
        if f.db_cpu_us and e.db_cpu_us
    ]
    print(
        f"{'PASS' if ratio >= TARGET_RATIO else 'MISS'}  {kind} full / empty: {ratio:.2f}x "
        f"(per round {', '.join(f'{r:.2f}' for r in ratios)}; target >= {TARGET_RATIO}); "
        f"CPU a webhook full / empty {median(cpu):.2f}x"
        + (f", the database's {median(db_cpu):.2f}x" if db_cpu else "")
    )
    return {f"{kind}_scale_ratio": ratio}


def drain_backlog(args: argparse.Namespace, work: Path) -> dict[str, float]:
    print(f"\n2. drain a backlog of {args.backlog:,} events (one download sink)")
    directory = work / "drain"
    directory.mkdir()
    db = directory / "inbox.db"
    backlog.cached_copy(
        f"backlog-{args.backlog}-pending.db",
        args.backlog,
        db,
        state="pending",
        body=backlog.logo_event,
    )
    stub = start_stub(args.loop, directory)
    port = free_port()
    config = receiver_config(
        directory,
        port=port,
        admin_port=free_port(),
        base_url=f"http://127.0.0.1:{stub.port}/v1",
        sinks=[
            {
                "name": "files",
                "type": "download",
                "directory": "downloads",
                "allow_private_networks": True,
            }
        ],
        worker={"concurrency": args.concurrency},
    )
    admin_port = int(read_toml(config)["admin"]["port"])
    receiver = Server(
        "receiver",
        receiver_command(config, "worker", args.loop),
        port=admin_port,
        cwd=directory,
        env=bench_env(),
    )
    started = time.monotonic()
    peak = 0.0
    last_report = started
    left = args.backlog
    try:
        receiver.start(ready_path="/healthz")
        started = last_report = time.monotonic()  # from ready: the start-up is not draining
        while True:
            peak = max(peak, rss_mb(receiver.pid()))
            now = time.monotonic()
            if now - last_report >= 5:
                left = backlog.pending(db)
                done = args.backlog - left
                print(
                    f"  {now - started:6.1f} s  {done:>8,} done  {left:>8,} left  "
                    f"{done / (now - started):7.1f} events/s  rss {rss_mb(receiver.pid()):.0f} MB",
                    flush=True,
                )
                last_report = now
                if left == 0:
                    break
            time.sleep(0.25)
        took = time.monotonic() - started
        peak = max(peak, peak_rss_mb(receiver.pid()))
    finally:
        receiver.stop()
        stub.stop()
    states = dict(backlog.iter_states(db))
    files = sum(1 for p in (directory / "downloads").rglob("*.png"))
    print(
        f"  drained {args.backlog:,} events in {took:.1f} s ({args.backlog / took:,.0f} events/s), "
        f"{files:,} files written, final states {states}"
    )
    print(
        f"{'PASS' if peak <= TARGET_RSS_MB else 'MISS'}  peak RSS {peak:.0f} MB "
        f"(target <= {TARGET_RSS_MB:.0f} MB)"
    )
    return {"drain_seconds": took, "drain_rate": args.backlog / took, "peak_rss_mb": peak}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stored", type=int, default=1_000_000)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16, help="worker.concurrency to drain")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default=event_loop_name())
    parser.add_argument("--only", choices=("ingest", "drain", "prune"))
    parser.add_argument("--stores", default="sqlite,postgres", help="for 1. and 3. (default both)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    print(f"bench scale: {machine_note(args.loop)}")
    with scratch("scale-", keep=args.keep) as work:
        if args.only in (None, "ingest"):
            need_wrk()
            for kind in args.stores.split(","):
                if kind == "postgres" and not postgres.reachable(POSTGRES_URL):
                    print(f"\n  note: no PostgreSQL at {POSTGRES_URL}: 1. on postgres left out")
                    continue
                ingest_at_scale(args, work, kind)
        if args.only in (None, "drain"):
            drain_backlog(args, work)
        if args.only in (None, "prune"):
            prune.run(args, work)
    print(f"\n  {machine_note(args.loop)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
