"""Where a webhook's time goes at 64 connections on SQLite: handler, wait, group write, answer.

Runs ``receiver serve --role intake`` on its SQLite inbox (``synchronous`` as asked, one download
sink, as bench.ingest's ``sqlite`` target) in a process of its own, started by
:mod:`bench.ingest.waits_server`, which stamps every webhook and every group commit with
``time.perf_counter()`` in memory and writes the stamps out when it stops. wrk loads it
(``-t2 -c64``, distinct pre-signed events, after a warm-up) for ``--seconds``; each request
accepted in the rounds is split into:

- (a) the handler until its event is handed to the store (reading the body, the signature,
  parsing the JSON, the event's values);
- (b) waiting for its group to start being written: queued until its group is formed (the
  previous group still being written), the writer's turn, the hand-off to the intake
  connection's thread;
- (c) its group's write: the transaction on that thread, its inserts and its commit (the fsync);
- (d) from the commit to the response being sent: back to the event loop, what the store does
  after the commit (a checkpoint between two groups, when due), the handler resuming and
  answering, aiohttp writing the response.

Prints p50/p90/p99 of each part and of the total (the handler's start to the response written),
their means (which add up, unlike percentiles), the group sizes, and the throughput. What comes
before the handler (the kernel, the event loop getting to the connection, aiohttp parsing the
request) is wrk's latency minus the total.

The garbage collections of the stamped rounds (each stops the event loop's thread) are counted
by generation, with their longest and total pause; ``--no-gc-freeze`` runs the stamped receiver
without what ``receiver serve`` does at start to keep its full collections short.

So a reader knows the stamps do not change the picture, the same wrk runs alternate with the
plain ``receiver serve --role intake`` (``--rounds``, 2): req/s and p99 of both, and their
ratio::

    python -m bench.ingest.waits [--seconds 10] [--rounds 2] [--warmup 3] [--loop uvloop]
        [--no-gc-freeze]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
    python_module,
    receiver_command,
    receiver_config,
    scratch,
    start_all,
)
from bench.ingest.__main__ import Runner
from bench.ingest.report import rounds_table
from tests.support.helpers import adjacent_free_ports

STAMPED = "stamped"
PLAIN = "plain"
# Requests (and groups) the stamped server has room for, a second of the run: well above what
# SQLite intake reaches on a small machine (a few thousand a second).
CAPACITY_PER_SECOND = 12_000

# (label, from, to) of each part, in the stamps' names: r.* a request's, g.* its group's.
PARTS: tuple[tuple[str, str, str], ...] = (
    ("(a) handler, until the event is handed to the store", "r.handled", "r.submitted"),
    ("(b) waiting for its group to start being written", "r.submitted", "g.begun"),
    ("    queued until its group is formed (previous group)", "r.submitted", "g.formed"),
    ("    the writer's turn", "g.formed", "g.turn"),
    ("    handed to the intake connection's thread", "g.turn", "g.begun"),
    ("(c) its group's write: transaction and commit (fsync)", "g.begun", "g.committed"),
    ("(d) from the commit to the response being sent", "g.committed", "r.sent"),
    ("    back to the event loop", "g.committed", "g.back"),
    ("    the store after the commit (checkpoint, when due)", "g.back", "g.done"),
    ("    the handler resumes and answers", "g.done", "r.returned"),
    ("    aiohttp writes the response", "r.returned", "r.sent"),
    ("total: handler start to response sent", "r.handled", "r.sent"),
)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank of sorted ``values`` (0.0 when empty)."""
    if not values:
        return 0.0
    return values[min(len(values) - 1, int(q * len(values)))]


@dataclass
class Window:
    """One stamped round: the requests and groups between its two marks."""

    requests: range
    groups: range


@dataclass
class Breakdown:
    """The accepted requests' parts (seconds), the groups' sizes and writes, what was left out."""

    parts: dict[str, list[float]] = field(default_factory=dict)
    sizes: list[int] = field(default_factory=list)
    writes: list[float] = field(default_factory=list)  # each group's (c)
    writer_busy: list[float] = field(default_factory=list)  # share of each round in (c)
    request_sizes: list[int] = field(default_factory=list)  # the size of each request's group
    accepted: int = 0
    non_2xx: int = 0
    incomplete: int = 0  # no group, or no response written (a connection wrk closed)


def windows(stamps: dict[str, Any]) -> list[Window]:
    """The rounds: marks are sent in pairs, before and after each stamped wrk run."""
    marks = stamps["marks"]
    if len(marks) % 2:
        raise RuntimeError(f"an odd number of marks ({len(marks)}): a signal was lost")
    return [
        Window(range(start[0], end[0]), range(start[1], end[1]))
        for start, end in zip(marks[::2], marks[1::2], strict=True)
    ]


def breakdown(stamps: dict[str, Any], rounds: list[Window]) -> Breakdown:
    requests, groups = stamps["requests"], stamps["groups"]
    group_of, status, size = stamps["group_of"], stamps["status"], stamps["size"]
    result = Breakdown(parts={label: [] for label, _, _ in PARTS})
    # (its values, the stamps it starts at, whether a request's (else its group's), the same
    # for where it ends)
    steps = []
    for label, source, target in PARTS:
        (from_kind, from_name), (to_kind, to_name) = source.split("."), target.split(".")
        start = requests[from_name] if from_kind == "r" else groups[from_name]
        end = requests[to_name] if to_kind == "r" else groups[to_name]
        steps.append((result.parts[label], start, from_kind == "r", end, to_kind == "r"))
    for window in rounds:
        first = last = None
        for i in window.requests:
            if status[i] // 100 != 2:
                result.non_2xx += 1
                continue
            g = group_of[i]
            if g < 0 or not requests["sent"][i] or not groups["committed"][g]:
                result.incomplete += 1
                continue
            result.accepted += 1
            result.request_sizes.append(size[g])
            for values, start, from_request, end, to_request in steps:
                values.append(end[i if to_request else g] - start[i if from_request else g])
            handled, sent = requests["handled"][i], requests["sent"][i]
            first = handled if first is None else min(first, handled)
            last = sent if last is None else max(last, sent)
        busy = 0.0
        for g in window.groups:
            if groups["committed"][g]:
                write = groups["committed"][g] - groups["begun"][g]
                result.sizes.append(size[g])
                result.writes.append(write)
                busy += write
        if first is not None and last is not None and last > first:
            result.writer_busy.append(busy / (last - first))
    for values in result.parts.values():
        values.sort()
    result.writes.sort()
    result.sizes.sort()
    result.request_sizes.sort()
    return result


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def parts_table(figures: Breakdown, wrk: list[WrkResult]) -> str:
    total = figures.parts[PARTS[-1][0]]
    mean_total = sum(total) / len(total) if total else 0.0
    table = Table(["per webhook", "p50 ms", "p90 ms", "p99 ms", "mean ms", "of the mean"])
    for label, _, _ in PARTS:
        values = figures.parts[label]
        mean = sum(values) / len(values) if values else 0.0
        share = f"{100 * mean / mean_total:.0f}%" if mean_total else "-"
        table.add(
            label,
            ms(percentile(values, 0.5)),
            ms(percentile(values, 0.9)),
            ms(percentile(values, 0.99)),
            ms(mean),
            share,
        )
    p50 = median([r.p50_ms for r in wrk])
    p99 = median([r.p99_ms for r in wrk])
    table.add("wrk's latency (median of the rounds)", f"{p50:.2f}", "-", f"{p99:.2f}", "-", "")
    return table.render()


def add_distribution(
    table: Table,
    label: str,
    values: Sequence[float],
    cell: Callable[[float], object],
    mean_cell: Callable[[float], str],
) -> None:
    """A row of sorted ``values``: p50, p90, p99, max (each ``cell``), mean (``mean_cell``)."""
    mean = sum(values) / len(values) if values else 0.0
    table.add(
        label,
        cell(percentile(values, 0.5)),
        cell(percentile(values, 0.9)),
        cell(percentile(values, 0.99)),
        cell(values[-1]) if values else 0,
        mean_cell(mean),
    )


def groups_table(figures: Breakdown) -> str:
    table = Table(["groups", "p50", "p90", "p99", "max", "mean"])
    sizes = figures.sizes
    one_place = "{:.1f}".format
    add_distribution(
        table, f"events per group ({len(sizes):,} groups)", sizes, lambda v: v, one_place
    )
    add_distribution(
        table, "the group a webhook is in, events", figures.request_sizes, lambda v: v, one_place
    )
    add_distribution(table, "a group's write (c), ms", figures.writes, ms, ms)
    return table.render()


def collections_line(stamps: dict[str, Any]) -> str:
    """The garbage collections within the stamped rounds, by generation: how many, the longest
    and the total pause."""
    marks = stamps["marks"]
    spans = [(start[2], end[2]) for start, end in zip(marks[::2], marks[1::2], strict=True)]
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    for generation, start, end in stamps.get("collections", []):
        if any(first <= start <= last for first, last in spans):
            pauses[generation].append(end - start)
    return "; ".join(
        f"generation {generation}: {len(values)}"
        + (f", longest {ms(max(values))} ms, in all {ms(sum(values))} ms" if values else "")
        for generation, values in pauses.items()
    )


def start_servers(work: Path, args: argparse.Namespace, stamps: Path) -> dict[str, Server]:
    """The stamped receiver and the plain one, each on its own inbox, on ``--loop``."""
    servers: dict[str, Server] = {}
    capacity = int(CAPACITY_PER_SECOND * (args.warmup + args.rounds * args.seconds)) + 10_000
    for name in (STAMPED, PLAIN):
        directory = work / name
        directory.mkdir()
        port = free_port()
        config = receiver_config(
            directory, port=port, admin_port=adjacent_free_ports(), synchronous=args.synchronous
        )
        if name == STAMPED:
            command = python_module(
                args.loop,
                "bench.ingest.waits_server",
                "--stamps",
                str(stamps),
                "--capacity",
                str(capacity),
                *(["--no-gc-freeze"] if args.no_gc_freeze else []),
                "serve",
                "--config",
                str(config),
                "--role",
                "intake",
            )
        else:
            command = receiver_command(config, "intake", args.loop)
        servers[name] = Server(name, command, port=port, cwd=directory, env=bench_env())
    return start_all(servers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2, help="of each server, alternating")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--synchronous", choices=("full", "normal"), default="full")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default=event_loop_name())
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--no-gc-freeze", action="store_true", help="the stamped receiver without gc.freeze()"
    )
    args = parser.parse_args(argv)
    need_wrk()
    print(f"bench ingest waits: {machine_note(args.loop)}")
    print(
        f"  SQLite, synchronous={args.synchronous}, wrk -t{args.threads} -c{args.connections}, "
        f"{args.rounds} rounds x {args.seconds:g} s of each server alternating, "
        f"after {args.warmup:g} s of warm-up",
        flush=True,
    )
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    pool_dir = Path(tempfile.mkdtemp(prefix="receiver-bench-", dir=shm))
    try:
        with scratch("waits-", keep=args.keep) as work:
            stamps_path = work / "stamps.json"
            servers = start_servers(work, args, stamps_path)
            results: dict[str, list[WrkResult]] = {STAMPED: [], PLAIN: []}
            order: list[list[str]] = []
            try:
                runner = Runner(args, pool_dir)
                for name in (STAMPED, PLAIN):
                    runner.measure(name, servers[name], args.warmup, warmup=True)
                stamped = servers[STAMPED].pid()
                for index in range(args.rounds):
                    names = [STAMPED, PLAIN] if index % 2 == 0 else [PLAIN, STAMPED]
                    order.append(names)
                    for name in names:
                        if name == STAMPED:
                            os.kill(stamped, signal.SIGUSR1)  # the round's first request is next
                        result = runner.measure(name, servers[name], args.seconds)
                        if name == STAMPED:
                            os.kill(stamped, signal.SIGUSR1)
                        results[name].append(result)
                        print(
                            f"  round {index + 1} {name:<8} {result.rps:>8,.0f} req/s  "
                            f"p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms  "
                            f"non-2xx {result.failures}  {result.cpu_text()}",
                            flush=True,
                        )
            finally:
                for server in servers.values():
                    server.stop()
            if not stamps_path.exists():
                raise RuntimeError(f"the stamped server wrote no stamps:\n{servers[STAMPED].log()}")
            stamps = json.loads(stamps_path.read_text())
    finally:
        shutil.rmtree(pool_dir, ignore_errors=True)

    figures = breakdown(stamps, windows(stamps))
    rps = [r.rps for r in results[STAMPED]]
    print("")
    print(
        f"where a webhook's time goes: {figures.accepted:,} webhooks answered 2xx in the stamped "
        f"rounds, {median(rps):,.0f} req/s (rounds {', '.join(f'{r:,.0f}' for r in rps)})"
    )
    left_out = f"{figures.non_2xx} non-2xx, {figures.incomplete} not answered (wrk closed them)"
    if stamps["dropped"]:
        left_out += f", {stamps['dropped']} past the stamps' capacity"
    print(f"  left out: {left_out}")
    print(parts_table(figures, results[STAMPED]))
    before = median([r.p50_ms for r in results[STAMPED]]) - 1000 * percentile(
        figures.parts[PARTS[-1][0]], 0.5
    )
    print(
        f"  wrk's p50 is {before:.2f} ms above the total's: before the handler (the kernel, the "
        "event loop getting to the connection, aiohttp parsing the request) and in wrk"
    )
    print("")
    print(groups_table(figures))
    if figures.writer_busy:
        busy = ", ".join(f"{100 * b:.0f}%" for b in figures.writer_busy)
        print(f"  the intake thread is in a group's transaction {busy} of each round's time")
    print(f"  garbage collections (the event loop stopped): {collections_line(stamps)}")
    print("")
    print("the stamps' overhead: the stamped receiver against the plain one, alternating")
    print(rounds_table(results, order))
    rps_ratios = [
        s.rps / p.rps for s, p in zip(results[STAMPED], results[PLAIN], strict=True) if p.rps
    ]
    p99_ratios = [
        s.p99_ms / p.p99_ms
        for s, p in zip(results[STAMPED], results[PLAIN], strict=True)
        if p.p99_ms
    ]
    print(
        f"  stamped / plain: req/s {median(rps_ratios):.2f}x "
        f"(rounds {', '.join(f'{r:.2f}' for r in rps_ratios)}), "
        f"p99 {median(p99_ratios):.2f}x (rounds {', '.join(f'{r:.2f}' for r in p99_ratios)})"
    )
    print(f"\n  {machine_note(args.loop)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
