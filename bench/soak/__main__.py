"""Soak: an hour of steady webhooks with minutes of retention; the inbox must level off.

One ``receiver serve`` (role ``all``, one process) with bench/stub.py as its upstream and an
http sink posting to the stub is fed ``--rate`` (100) signed webhooks a second, every one a
distinct event, for ``--minutes`` (60). The receiver keeps processed events ``--retention``
(120) seconds, through the benchmark-only ``RECEIVER_BENCH_RETENTION_SECONDS`` (no minimum,
unlike ``[store].retention_hours``; its retention cycle, prune then SQLite's incremental vacuum,
runs every tenth of it), so arrivals and expiries reach a steady state within minutes.

Every ``--sample`` (10) seconds: the SQLite files' sizes (``.db``, ``-wal``, ``-shm``), the
receiver's RSS and open file descriptors, the inbox's events by state
(``receiver_inbox_events``), ``receiver_inbox_pruned_events_total``,
``receiver_inbox_file_bytes`` and ``receiver_inbox_free_bytes`` from its /metrics ("n/a" where
the receiver does not export them); on Postgres the schema's tables' ``pg_total_relation_size``
and ``pg_stat_user_tables`` (live and dead rows, the last autovacuum). Every sample goes to a
CSV in the run's scratch directory (kept; its path is printed).

Reported: the samples at the start (the first one after one full retention period, when the
inbox first reaches its steady size), the middle (halfway from the start to the end) and the
end, and whether the size, the RSS and the fds level off: end / middle <= 1.10. Postgres: dead
/ live rows, the bloat. Non-2xx answers must be 0. At the end, each table of the inbox (rows
and bytes; on Postgres dead rows, autovacuums and the server's autovacuum settings): which of
them grows when the whole does.

The Postgres store uses ``$RECEIVER_BENCH_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``), a fresh schema dropped afterwards, and is left
out, with a note, when it does not answer::

    python -m bench.soak [--minutes 60] [--rate 100] [--retention 120] [--sample 10]
                         [--stores sqlite,postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from bench.common import (
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
from bench.ingest.__main__ import POSTGRES_URL
from bench.soak.postgres_stats import pg_connect, postgres_answers
from bench.soak.report import (
    CSV_FIELDS,
    LEVEL_RATIO,
    csv_row,
    pg_bloat_lines,
    pick,
    report,
    sqlite_table_lines,
)
from bench.soak.samples import SQLITE_FILES, Sampler
from bench.soak.traffic import Traffic, send_steady
from receiver.config.sink_types import SINK_TYPES
from receiver.store.retention_timing import BENCH_ENV as RETENTION_ENV

STORES = ("sqlite", "postgres")


async def soak_store(
    store: str, args: argparse.Namespace, work: Path, writer: csv.DictWriter[str]
) -> bool:
    directory = work / store
    directory.mkdir()
    stub_port, port, admin_port = free_port(), free_port(), free_port()
    env = bench_env()
    schema = None
    pg = None
    if store == "postgres":
        schema = "receiver_soak_" + uuid.uuid4().hex[:12]
        pg = await pg_connect()
    stub = Server(
        "stub",
        python_module(args.loop, "bench.stub", "--port", str(stub_port)),
        port=stub_port,
        cwd=directory,
        env=env,
    )
    config = receiver_config(
        directory,
        port=port,
        admin_port=admin_port,
        base_url=f"http://127.0.0.1:{stub_port}/v1",
        sinks=[
            {
                "name": "forward",
                "type": "http",
                "url": f"http://127.0.0.1:{stub_port}/capture",
                "secret": "whsec_bench_forward",
            }
        ],
        store={"url": POSTGRES_URL, "schema": schema} if schema else None,
    )
    receiver = Server(
        "receiver",
        receiver_command(config, "all", args.loop),
        port=port,
        cwd=directory,
        env={**env, RETENTION_ENV: f"{args.retention:g}"},
    )
    pg_port = (urlsplit(POSTGRES_URL).port or 5432) if store == "postgres" else None
    seconds = args.minutes * 60
    print(f"\n  {store}: {directory}" + (f", schema {schema}" if schema else ""))
    try:
        stub.start()
        receiver.start()
        traffic = Traffic()
        sampler = Sampler(
            store,
            pid=receiver.pid(),
            directory=directory,
            metrics_url=f"http://127.0.0.1:{admin_port}/metrics",
            traffic=traffic,
            loop_name=args.loop,
            ports={"webhooks": port, "admin": admin_port, "upstream": stub_port, "db": pg_port},
            pg=pg,
            schema=schema,
        )
        sender = asyncio.create_task(
            send_steady(f"http://127.0.0.1:{port}{WEBHOOK_PATH}", args.rate, seconds, traffic)
        )
        try:
            await sampler.run(args.sample, seconds, sender)
        finally:
            if not sender.done():
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sender
            for sample in sampler.samples:
                writer.writerow(csv_row(sample))
        if receiver.proc is not None and receiver.proc.poll() is not None:
            print(
                f"  MISS  {store}: the receiver exited ({receiver.proc.returncode}):\n"
                f"{receiver.log()}"
            )
            return False
        # The receiver stopped first: its inbox file is then read alone.
        receiver.stop()
        stub.stop()
        if pg is not None:
            extra = await pg_bloat_lines(pg, sampler, pick(sampler.samples, args.retention))
        else:
            extra = sqlite_table_lines(directory / SQLITE_FILES["db"])
        return report(store, sampler, args, extra)
    finally:
        receiver.stop()
        stub.stop()
        if pg is not None:
            try:
                await pg.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            except Exception as exc:
                print(f"  note: schema {schema} not dropped: {exc}")
            await pg.close()
        if not args.keep:
            for name in SQLITE_FILES.values():
                (directory / name).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="of traffic (default 60)")
    parser.add_argument("--rate", type=float, default=100.0, help="webhooks a second (100)")
    parser.add_argument(
        "--retention",
        type=float,
        default=120.0,
        help=f"seconds processed events are kept ({RETENTION_ENV}; default 120)",
    )
    parser.add_argument("--sample", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--stores", default=",".join(STORES), help="sqlite,postgres (both)")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default=event_loop_name())
    parser.add_argument(
        "--keep", action="store_true", help="keep the inbox files too (the CSV is always kept)"
    )
    args = parser.parse_args(argv)
    stores = tuple(dict.fromkeys(s for s in args.stores.split(",") if s))
    if unknown := set(stores) - set(STORES):
        parser.error(f"unknown stores: {', '.join(sorted(unknown))}")
    if args.rate <= 0 or args.retention <= 0 or args.sample <= 0 or args.minutes <= 0:
        parser.error("--rate, --retention, --sample and --minutes must be positive")
    if "http" not in SINK_TYPES:
        sys.exit("bench soak: this build has no http sink type")
    print(f"bench soak: {machine_note(args.loop)}")
    if "postgres" in stores and (why := asyncio.run(postgres_answers())) is not None:
        print(f"  note: no PostgreSQL at {POSTGRES_URL} ({why}): postgres left out")
        stores = tuple(s for s in stores if s != "postgres")
    if not stores:
        return 1
    print(
        f"  {args.minutes:g} min of {args.rate:g} webhooks/s (each a distinct event), retention "
        f"{args.retention:g} s ({RETENTION_ENV}; a retention cycle every "
        f"{args.retention / 10:g} s), a sample every {args.sample:g} s, stores "
        f"{', '.join(stores)}; levels off: end / middle <= {LEVEL_RATIO:.2f}"
    )
    passed = True
    with scratch("soak-", keep=True) as work:
        csv_path = work / "samples.csv"
        with csv_path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
            writer.writeheader()
            for store in stores:
                passed = asyncio.run(soak_store(store, args, work, writer)) and passed
                handle.flush()
        print(f"\n  samples: {csv_path}")
    print(f"\n  {machine_note(args.loop)}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
