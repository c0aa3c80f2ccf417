"""Ingest benchmark: the receiver's intake against two baselines, alternating, in one run.

Targets, alternately in every round (the order rotates between rounds):

- ``bare``: an aiohttp handler that reads the body and answers 200;
- ``naive``: the same handler verifying the signature and doing one aiosqlite INSERT + commit;
- ``no-store``: ``receiver serve --role intake`` with a store that keeps nothing
  (:mod:`bench.ingest.no_store`): the receiver's ceiling here, whatever the store;
- ``sqlite``: ``receiver serve --role intake`` on its SQLite inbox (``synchronous`` as asked,
  one download sink configured so every event also gets its delivery row);
- ``postgres``: the same on a Postgres inbox (a fresh schema, dropped afterwards);
- ``sqlite-x2``, ``postgres-x2``: the same with ``--processes 2``.

The Postgres targets need PostgreSQL at ``$RECEIVER_BENCH_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``) and are left out, with a note, when it does not
answer. Every request is a distinct pre-signed event (no duplicates; the run says so if the pool
ran out). Prints req/s, p50/p99 and non-2xx for each, per round and as medians, and each
receiver's ratio to bare (median of the per-round ratios: adjacent measurements share the
machine's load)::

    python -m bench.ingest [--rounds 3] [--seconds 10] [--connections 64] [--threads 2]
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    port_open,
    python_module,
    receiver_command,
    receiver_config,
    run_wrk,
    scratch,
    write_requests,
)
from tests.support.helpers import adjacent_free_ports

RECEIVERS = ("sqlite", "postgres", "sqlite-x2", "postgres-x2")
BASELINES = ("bare", "naive")
NO_STORE = "no-store"
TARGETS = ("bare", "naive", NO_STORE, *RECEIVERS)
POSTGRES_URL = os.environ.get(
    "RECEIVER_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
TARGET_SQLITE_BARE = 0.5
TARGET_POSTGRES_BARE = 0.45
TARGET_POSTGRES_SQLITE = 0.9
TARGET_P99_MS = 25.0


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
    for name in (NO_STORE, *RECEIVERS, "previous"):
        if name not in only:
            continue
        directory = work / name
        directory.mkdir()
        port = free_port()
        store = {"url": "memory://"} if name == NO_STORE else None
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
        module = "bench.ingest.no_store" if name == NO_STORE else "receiver"
        command = receiver_command(config, "intake", args.loop, module)
        server_env = env
        if name == "previous":
            # The receiver package of another checkout first on the path (bench stays ours).
            server_env = {"PYTHONPATH": f"{args.previous}:{env['PYTHONPATH']}"}
        servers[name] = Server(name, command, port=port, cwd=directory, env=server_env)
    for name, kind in (("bare", "bare"), ("naive", "sqlite")):
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
            str(work / "baseline.db"),
            "--synchronous",
            args.synchronous,
        )
        servers[name] = Server(name, command, port=port, cwd=work, env=env)
    try:
        for server in servers.values():
            server.start()
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


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
            result = run_wrk(
                f"http://{host}/webhooks",
                prefix,
                threads=self.args.threads,
                connections=self.args.connections,
                seconds=seconds,
            )
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


def report(
    results: dict[str, list[WrkResult]], order: list[list[str]], out: Callable[[str], None]
) -> dict[str, float]:
    table = Table(["round", "target", "req/s", "p50 ms", "p99 ms", "max ms", "non-2xx", "reused"])
    for index, names in enumerate(order):
        for name in names:
            r = results[name][index]
            table.add(
                index + 1,
                name,
                f"{r.rps:,.0f}",
                f"{r.p50_ms:.2f}",
                f"{r.p99_ms:.2f}",
                f"{r.max_ms:.1f}",
                r.failures,
                r.reused,
            )
    out(table.render())
    out("")
    bare = results.get("bare")
    summary = Table(
        ["target", "median req/s", "median p50 ms", "median p99 ms", "non-2xx", "x bare"]
    )
    figures: dict[str, float] = {}
    for name, runs in results.items():
        ratio = ""
        if bare and name != "bare":
            ratios = [a.rps / b.rps for a, b in zip(runs, bare, strict=True) if b.rps]
            figures[f"{name}/bare"] = median(ratios)
            ratio = f"{median(ratios):.2f}"
        figures[f"{name}:p99"] = median([r.p99_ms for r in runs])
        figures[f"{name}:non2xx"] = sum(r.failures for r in runs)
        summary.add(
            name,
            f"{median([r.rps for r in runs]):,.0f}",
            f"{median([r.p50_ms for r in runs]):.2f}",
            f"{figures[f'{name}:p99']:.2f}",
            int(figures[f"{name}:non2xx"]),
            ratio,
        )
    out(summary.render())
    comparisons = [(name, "sqlite") for name in ("postgres", "postgres-x2", "previous")]
    # What storing costs: each receiver against the same receiver storing nothing.
    comparisons += [(name, NO_STORE) for name in RECEIVERS]
    for name, base in comparisons:
        if name in results and base in results:
            pairs = zip(results[name], results[base], strict=True)
            ratios = [a.rps / b.rps for a, b in pairs if b.rps]
            figures[f"{name}/{base}"] = median(ratios)
            out(
                f"{name} / {base}: {median(ratios):.2f}x (median of per-round ratios "
                f"{', '.join(f'{x:.2f}' for x in ratios)})"
            )
    return figures


def check(figures: dict[str, float], out: Callable[[str], None]) -> bool:
    wanted = [
        ("sqlite/bare", ">=", TARGET_SQLITE_BARE),
        ("postgres/bare", ">=", TARGET_POSTGRES_BARE),
        ("postgres/sqlite", ">=", TARGET_POSTGRES_SQLITE),
        ("sqlite:p99", "<=", TARGET_P99_MS),
        ("postgres:p99", "<=", TARGET_P99_MS),
        *((f"{name}:non2xx", "<=", 0.0) for name in RECEIVERS),
    ]
    out("")
    ok_all = True
    for key, op, bound in wanted:
        if key not in figures:
            continue
        value = figures[key]
        ok = value >= bound if op == ">=" else value <= bound
        ok_all = ok_all and ok
        out(f"{'PASS' if ok else 'MISS'}  {key} {op} {bound:g}: {value:.2f}")
    return ok_all


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
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument(
        "--previous",
        metavar="CHECKOUT",
        help="also measure the receiver of another checkout (e.g. a git worktree of an older "
        "commit), as target 'previous', to see what a change is worth",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    only = tuple(dict.fromkeys(t for t in args.targets.split(",") if t))
    if args.previous and "previous" not in only:
        only = (*only, "previous")
    if unknown := set(only) - {*TARGETS, "previous"}:
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    if any(t.startswith("postgres") for t in only) and not postgres_up():
        print(f"  note: no PostgreSQL at {POSTGRES_URL}: the postgres targets are left out")
        only = tuple(t for t in only if not t.startswith("postgres"))
    need_wrk()
    print(f"bench ingest: {machine_note(args.loop)}")
    print(
        f"  {args.rounds} rounds x {args.seconds:g} s, wrk -t{args.threads} -c{args.connections},"
        f" synchronous={args.synchronous}, targets {', '.join(only)}"
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
                            f"  round {index + 1} {name:<11} {result.rps:>8,.0f} req/s  "
                            f"p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms  "
                            f"non-2xx {result.failures}",
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
            figures = report(results, order, print)
            check(figures, print)
            print(f"\n  {machine_note(args.loop)}")
    finally:
        shutil.rmtree(pool_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
