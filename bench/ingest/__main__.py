"""Ingest benchmark: the receiver's intake against two baselines, alternating, in one run.

Targets, alternately in every round (the order rotates between rounds):

- ``receiver``: ``receiver serve --role intake`` (SQLite inbox, ``synchronous`` as asked,
  one download sink configured so every event also gets its delivery row);
- ``bare``: an aiohttp handler that reads the body and answers 200;
- ``sqlite``: the same handler verifying the signature and doing one aiosqlite INSERT + commit.

Every request is a distinct pre-signed event (no duplicates; the run says so if the pool ran
out). Prints req/s, p50/p99 and non-2xx for each, per round and as medians, and the ratios
receiver/bare and receiver/sqlite (median of the per-round ratios: adjacent measurements share
the machine's load)::

    python -m bench.ingest [--rounds 3] [--seconds 10] [--connections 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

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
    python_module,
    receiver_command,
    receiver_config,
    run_wrk,
    scratch,
    write_requests,
)

TARGETS = ("receiver", "bare", "sqlite")
TARGET_RATIO_BARE = 0.75
TARGET_RATIO_SQLITE = 2.5
TARGET_P99_MS = 15.0


def start_servers(work: Path, args: argparse.Namespace, only: tuple[str, ...]) -> dict[str, Server]:
    """Every target on the same event loop (``--loop``), each in its own process."""
    servers: dict[str, Server] = {}
    env = bench_env()
    for name in ("receiver", "previous"):
        if name not in only:
            continue
        directory = work / name
        directory.mkdir()
        port = free_port()
        config = receiver_config(
            directory, port=port, admin_port=free_port(), synchronous=args.synchronous
        )
        command = receiver_command(config, "intake", args.loop)
        server_env = env
        if name == "previous":
            # The receiver package of another checkout first on the path (bench stays ours).
            server_env = {"PYTHONPATH": f"{args.previous}:{env['PYTHONPATH']}"}
        servers[name] = Server(name, command, port=port, cwd=directory, env=server_env)
    for kind in ("bare", "sqlite"):
        if kind not in only:
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
        servers[kind] = Server(kind, command, port=port, cwd=work, env=env)
    try:
        for server in servers.values():
            server.start()
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


class Runner:
    """Runs wrk at one server with a fresh pool of distinct events, sized from past rates."""

    def __init__(self, args: argparse.Namespace, pool_dir: Path) -> None:
        self.args = args
        self.pool_dir = pool_dir
        self.rates: dict[str, float] = {}
        self.runs = 0

    def measure(self, name: str, server: Server, seconds: float) -> WrkResult:
        self.runs += 1
        count = int(self.rates.get(name, 25000.0) * seconds * 1.4) + 2000
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
            print(f"  note: {name} ran out of distinct events ({result.reused} repeated)")
        self.rates[name] = max(self.rates.get(name, 0.0), result.rps, 1000.0)
        return result


def stored_events(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])


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
    summary = Table(["target", "median req/s", "median p50 ms", "median p99 ms", "non-2xx total"])
    for name, runs in results.items():
        summary.add(
            name,
            f"{median([r.rps for r in runs]):,.0f}",
            f"{median([r.p50_ms for r in runs]):.2f}",
            f"{median([r.p99_ms for r in runs]):.2f}",
            sum(r.failures for r in runs),
        )
    out(summary.render())
    figures: dict[str, float] = {}
    if "receiver" in results:
        rec = results["receiver"]
        figures["p99_ms"] = median([r.p99_ms for r in rec])
        figures["non_2xx"] = sum(r.failures for r in rec)
        for base in ("bare", "sqlite", "previous"):
            if base in results:
                ratios = [a.rps / b.rps for a, b in zip(rec, results[base], strict=True) if b.rps]
                figures[f"ratio_{base}"] = median(ratios)
                out(
                    f"receiver / {base}: {median(ratios):.2f}x (median of per-round ratios "
                    f"{', '.join(f'{x:.2f}' for x in ratios)})"
                )
    return figures


def check(figures: dict[str, float], out: Callable[[str], None]) -> bool:
    checks = []
    if "ratio_bare" in figures:
        checks.append(
            (
                f"receiver >= {TARGET_RATIO_BARE}x bare",
                figures["ratio_bare"],
                figures["ratio_bare"] >= TARGET_RATIO_BARE,
            )
        )
    if "ratio_sqlite" in figures:
        checks.append(
            (
                f"receiver >= {TARGET_RATIO_SQLITE}x sqlite",
                figures["ratio_sqlite"],
                figures["ratio_sqlite"] >= TARGET_RATIO_SQLITE,
            )
        )
    if "p99_ms" in figures:
        checks.append(
            (
                f"receiver p99 <= {TARGET_P99_MS} ms",
                figures["p99_ms"],
                figures["p99_ms"] <= TARGET_P99_MS,
            )
        )
        checks.append(("receiver non-2xx == 0", figures["non_2xx"], figures["non_2xx"] == 0))
    out("")
    for label, value, ok in checks:
        out(f"{'PASS' if ok else 'MISS'}  {label}: {value:.2f}")
    return all(ok for _, _, ok in checks)


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
    only = tuple(t for t in args.targets.split(",") if t)
    if args.previous:
        only = (*only, "previous")
    if unknown := set(only) - {*TARGETS, "previous"}:
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
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
        with scratch("ingest-", keep=args.keep) as work:
            servers = start_servers(work, args, only)
            try:
                runner = Runner(args, pool_dir)
                for name in only:
                    runner.measure(name, servers[name], args.warmup)
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
                            f"  round {index + 1} {name:<8} {result.rps:>8,.0f} req/s  "
                            f"p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms  "
                            f"non-2xx {result.failures}",
                            flush=True,
                        )
                if "receiver" in servers:
                    stored = stored_events(work / "receiver" / "inbox.db")
                    print(f"  receiver inbox holds {stored:,} events after the run")
            finally:
                for server in servers.values():
                    server.stop()
            print("")
            figures = report(results, order, print)
            check(figures, print)
            print(f"\n  {machine_note(args.loop)}")
    finally:
        shutil.rmtree(pool_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
