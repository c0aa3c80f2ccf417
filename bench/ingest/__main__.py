"""Ingest benchmark: the receiver's intake against two baselines, alternating, in one run.

Targets, alternately in every round (the order rotates between rounds):

- ``bare``: an aiohttp handler that reads the body and answers 200;
- ``naive``: the same handler verifying the signature and doing one aiosqlite INSERT + commit;
- ``grouped``: the same handler with the receiver's group commit into one table holding only the
  id, the body and the time: the most any SQLite inbox could reach here (what the receiver's
  own schema, its deliveries and ledger and indexes, costs is ``sqlite`` against it);
  ``grouped-postgres`` the same on PostgreSQL (a fresh schema, dropped afterwards);
- ``no-store``: ``receiver serve --role intake`` with a store that keeps nothing
  (:mod:`bench.ingest.no_store`): the receiver's ceiling here, whatever the store;
- ``sqlite``: ``receiver serve --role intake`` on its SQLite inbox (``synchronous`` as asked,
  one download sink configured so every event also gets its delivery row);
- ``postgres``: the same on a Postgres inbox (a fresh schema, dropped afterwards);
- ``naive-fsync``, ``sqlite-fsync``: ``naive`` and ``sqlite`` on a slower disk: every fsync and
  fdatasync of theirs takes ``--fsync-ms`` (2 ms) more (:mod:`bench.ingest.slow_fsync`, an
  ``LD_PRELOAD`` shim compiled with gcc for the run): what group commit is worth where a flush
  costs what it does on network block storage;
- ``sqlite-x2``, ``postgres-x2`` (only when asked for): ``--processes 2``;
- ``sqlite-traced``: ``sqlite`` with ``[tracing]`` on, ``sample_ratio = 1.0``, every span
  exported over OTLP/HTTP to a collector stand-in (:mod:`bench.ingest.collector`): what tracing
  costs intake (its ratio to ``sqlite``).

The Postgres targets need PostgreSQL at ``$RECEIVER_BENCH_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``) and are left out, with a note, when it does not
answer. Every request is a distinct pre-signed event (no duplicates; the run says so if the pool
ran out). Prints req/s, p50/p99, non-2xx and the server's CPU time per request for each, per
round and as medians with their spread, and each target's ratio to bare and to no-store (median
of the per-round ratios: adjacent measurements share the machine's load)::

    python -m bench.ingest [--rounds 3] [--seconds 10] [--connections 64] [--threads 2]
        [--targets ...] [--fsync-ms 2] [--loop uvloop|asyncio] [--previous CHECKOUT]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench.common import (
    Server,
    WrkResult,
    bench_env,
    event_loop_name,
    free_port,
    machine_note,
    need_wrk,
    port_open,
    python_module,
    receiver_command,
    receiver_config,
    run_wrk,
    scratch,
    start_all,
    write_requests,
)
from bench.ingest import slow_fsync
from bench.ingest.report import NO_STORE, check, report
from bench.proc import command_cpu, cpu_seconds, cpu_since
from tests.support.helpers import adjacent_free_ports

RECEIVERS = ("sqlite", "postgres", "sqlite-fsync", "sqlite-x2", "postgres-x2")
TARGETS = (
    "bare",
    "naive",
    "grouped",
    NO_STORE,
    "sqlite",
    "grouped-postgres",
    "postgres",
    "naive-fsync",
    "sqlite-fsync",
)
# Each baseline target and its kind in bench.ingest.baselines.
BASELINES = (
    ("bare", "bare"),
    ("naive", "sqlite"),
    ("grouped", "grouped"),
    ("grouped-postgres", "grouped-postgres"),
    ("naive-fsync", "sqlite"),
)
# The receiver on SQLite with tracing on (sample_ratio 1.0), exporting to a collector stand-in.
TRACED = "sqlite-traced"
EVERY_TARGET = (*TARGETS, "sqlite-x2", "postgres-x2", TRACED)
# With --previous CHECKOUT: that checkout's receiver, on SQLite and (with no-store) storing nothing.
PREVIOUS = ("previous", "previous-no-store")
POSTGRES_URL = os.environ.get(
    "RECEIVER_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
# Printed as ratios besides x bare and x no-store.
COMPARISONS = (
    ("postgres", "sqlite"),
    ("sqlite", "grouped"),
    ("postgres", "grouped-postgres"),
    ("previous", "sqlite"),
    ("previous-no-store", NO_STORE),
    ("sqlite-fsync", "naive-fsync"),
    ("sqlite-fsync", "sqlite"),
    (TRACED, "sqlite"),
)


def postgres_up() -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(POSTGRES_URL)
    return port_open(parts.port or 5432) if parts.hostname in ("127.0.0.1", "localhost") else True


def start_servers(
    work: Path, args: argparse.Namespace, only: tuple[str, ...], schemas: dict[str, str]
) -> dict[str, Server]:
    """Every target on the same event loop (``--loop``), each in its own process."""
    servers: dict[str, Server] = {}
    env = bench_env()
    slow_disk: dict[str, str] = {}
    if any(name.endswith("-fsync") for name in only):
        slow_disk = slow_fsync.build(work, args.fsync_ms)
    tracing = _collector(work, env, servers) if TRACED in only else None
    for name in (NO_STORE, *RECEIVERS, *PREVIOUS, TRACED):
        if name not in only:
            continue
        directory = work / name
        directory.mkdir()
        port = free_port()
        store = {"url": "memory://"} if name.endswith(NO_STORE) else None
        if name.startswith("postgres"):
            schemas[name] = "receiver_bench_" + uuid.uuid4().hex[:12]
            store = {"url": POSTGRES_URL, "schema": schemas[name]}
        config = receiver_config(
            directory,
            port=port,
            admin_port=adjacent_free_ports(),
            synchronous=args.synchronous,
            store=store,
            processes=2 if name.endswith("-x2") else 1,
        )
        if name == TRACED and tracing is not None:
            with config.open("a") as toml:
                toml.write(tracing)
        module = "bench.ingest.no_store" if name.endswith(NO_STORE) else "receiver"
        command = receiver_command(config, "intake", args.loop, module)
        server_env = {**env, **slow_disk} if name.endswith("-fsync") else env
        if name.startswith("previous"):
            # The receiver package of another checkout first on the path.
            server_env = {"PYTHONPATH": f"{args.previous}:{env['PYTHONPATH']}"}
        servers[name] = Server(name, command, port=port, cwd=directory, env=server_env)
    for name, kind in BASELINES:
        if name not in only:
            continue
        port = free_port()
        command = python_module(
            args.loop,
            "bench.ingest.baselines",
            kind,
            "--port",
            str(port),
            "--db",
            str(work / f"{name}.db"),
            "--synchronous",
            args.synchronous,
        )
        if kind == "grouped-postgres":
            schemas[name] = "receiver_bench_" + uuid.uuid4().hex[:12]
            command += ["--postgres", POSTGRES_URL, "--schema", schemas[name]]
        server_env = {**env, **slow_disk} if name.endswith("-fsync") else env
        servers[name] = Server(name, command, port=port, cwd=work, env=server_env)
    return start_all(servers)


def _collector(work: Path, env: dict[str, str], servers: dict[str, Server]) -> str:
    """Start the OTLP collector stand-in; the ``[tracing]`` table that exports to it."""
    port = free_port()
    command = [sys.executable, "-m", "bench.ingest.collector", "--port", str(port)]
    servers["otlp-collector"] = Server("otlp-collector", command, port=port, cwd=work, env=env)
    endpoint = f"http://127.0.0.1:{port}"
    return f'\n[tracing]\nenabled = true\nendpoint = "{endpoint}"\nsample_ratio = 1.0\n'


async def _postgres(schema: str, query: str) -> Any:
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        return await conn.fetchval(query.format(schema='"' + schema + '"'))
    finally:
        await conn.close()


def stored_events(work: Path, name: str, schemas: dict[str, str]) -> int:
    if name in schemas:
        return int(asyncio.run(_postgres(schemas[name], "SELECT count(*) FROM {schema}.events")))
    with sqlite3.connect(work / name / "inbox.db") as conn:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])


def drop_schemas(schemas: dict[str, str]) -> None:
    for schema in schemas.values():
        try:
            asyncio.run(_postgres(schema, "DROP SCHEMA IF EXISTS {schema} CASCADE"))
        except Exception as exc:
            print(f"  note: schema {schema} not dropped: {exc}")


class Runner:
    """Runs wrk at one server with a fresh pool of distinct events, sized from past rates."""

    def __init__(self, args: argparse.Namespace, pool_dir: Path) -> None:
        self.args = args
        self.pool_dir = pool_dir
        self.rates: dict[str, float] = {}
        self.runs = 0
        # Also the database server's CPU a request, for every target (not only those named
        # postgres-something).
        self.database_cpu = False

    def measure(
        self, name: str, server: Server, seconds: float, *, warmup: bool = False
    ) -> WrkResult:
        self.runs += 1
        # Twice the best rate seen so far: a round may well run faster than the warm-up did.
        count = int(self.rates.get(name, 12000.0) * seconds * 2.0) + 2000
        host = f"127.0.0.1:{server.port}"
        prefix = write_requests(
            self.pool_dir, f"{name}-{self.runs}", count, threads=self.args.threads, host=host
        )
        try:
            db = self.database_cpu or "postgres" in name
            cpu_before = cpu_seconds(server.pid())
            db_before = command_cpu("postgres") if db else {}
            result = run_wrk(
                f"http://{host}/webhooks",
                prefix,
                threads=self.args.threads,
                connections=self.args.connections,
                seconds=seconds,
            )
            cpu = cpu_seconds(server.pid()) - cpu_before
            result.cpu_us = cpu * 1e6 / result.requests if result.requests else 0.0
            if db and result.requests:
                db_cpu = cpu_since(db_before, command_cpu("postgres"))
                result.db_cpu_us = db_cpu * 1e6 / result.requests
        finally:
            for path in self.pool_dir.glob(f"{prefix.name}-*.bin"):
                path.unlink()
        if result.reused:
            # A warm-up's pool is sized from a guess (no rate seen yet): on a fast machine it may
            # run out, which matters to no figure (warm-ups only size the rounds' pools).
            when = " in its warm-up, which is not reported" if warmup else ""
            print(f"  note: {name} ran out of distinct events ({result.reused} repeated){when}")
        self.rates[name] = max(self.rates.get(name, 0.0), result.rps, 1000.0)
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--synchronous", choices=("full", "normal"), default="full")
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default=event_loop_name(),
        help="event loop of every target (default: what receiver serve uses here)",
    )
    parser.add_argument(
        "--targets",
        default=",".join(TARGETS),
        help=f"comma-separated, of {', '.join(EVERY_TARGET)} (default: all but the -x2 ones)",
    )
    parser.add_argument(
        "--fsync-ms",
        type=float,
        default=2.0,
        help="what the -fsync targets' disk adds to every fsync and fdatasync (default 2)",
    )
    parser.add_argument(
        "--previous",
        metavar="CHECKOUT",
        help="also measure the receiver of another checkout (e.g. a git worktree of an older "
        "commit), as target 'previous', to see what a change is worth",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    only = tuple(dict.fromkeys(t for t in args.targets.split(",") if t))
    if args.previous:
        only = (*only, *(p for p in PREVIOUS if p not in only))
        if NO_STORE not in only:
            only = tuple(t for t in only if t != "previous-no-store")
    if unknown := set(only) - {*EVERY_TARGET, *PREVIOUS}:
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    if any("postgres" in t for t in only) and not postgres_up():
        print(f"  note: no PostgreSQL at {POSTGRES_URL}: the postgres targets are left out")
        only = tuple(t for t in only if "postgres" not in t)
    need_wrk()
    print(f"bench ingest: {machine_note(args.loop)}")
    print(
        f"  {args.rounds} rounds x {args.seconds:g} s, wrk -t{args.threads} -c{args.connections},"
        f" synchronous={args.synchronous}, -fsync targets +{args.fsync_ms:g} ms a sync,"
        f" targets {', '.join(only)}"
    )
    # Request pools live in memory (/dev/shm when present): writing them must not compete
    # with the fsyncs being measured.
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    pool_dir = Path(tempfile.mkdtemp(prefix="receiver-bench-", dir=shm))
    try:
        schemas: dict[str, str] = {}
        with scratch("ingest-", keep=args.keep) as work:
            servers = start_servers(work, args, only, schemas)
            try:
                runner = Runner(args, pool_dir)
                for name in only:
                    runner.measure(name, servers[name], args.warmup, warmup=True)
                results: dict[str, list[WrkResult]] = {name: [] for name in only}
                order: list[list[str]] = []
                for index in range(args.rounds):
                    shift = index % len(only)
                    names = list(only[shift:] + only[:shift])
                    order.append(names)
                    for name in names:
                        result = runner.measure(name, servers[name], args.seconds)
                        results[name].append(result)
                        print(
                            f"  round {index + 1} {name:<17} {result.rps:>8,.0f} req/s  "
                            f"p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms  "
                            f"non-2xx {result.failures}  {result.cpu_text()}",
                            flush=True,
                        )
                for name in (*RECEIVERS, "previous"):
                    if name in servers:
                        stored = stored_events(work, name, schemas)
                        print(f"  {name} inbox holds {stored:,} events after the run")
            finally:
                for server in servers.values():
                    server.stop()
                drop_schemas(schemas)
            print("")
            comparisons = [*COMPARISONS, *((name, NO_STORE) for name in RECEIVERS)]
            figures = report(results, order, print, comparisons)
            check(figures, [*RECEIVERS, *PREVIOUS], print)
            print(f"\n  {machine_note(args.loop)}")
    finally:
        shutil.rmtree(pool_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
