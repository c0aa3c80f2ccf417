"""bench-scale, part 3: intake while retention prunes a million expired events.

Two inboxes hold ``--stored`` done events received 200 hours ago, past the default retention
(168 h). Each is served as a deployment splits it: ``receiver serve --role intake`` (wrk's
target) and ``--role worker`` (the workers and retention, which runs only where workers run),
each with its own ops listener; the workers process what intake takes in through the upstream
stand-in (bench/stub.py) to an HTTP sink on it. The *baseline* keeps everything
(``RECEIVER_BENCH_RETENTION_SECONDS`` = 10^9); the *prune* side runs with the default retention,
so its worker has the whole stored count to prune from its start.

Each side is measured alone: while one side's warm-up or round runs, the other side's two
processes are stopped (SIGSTOP) and resumed (SIGCONT) afterwards, so neither side's background
work (the prune side's pruning, either worker's processing of what wrk sent) slows the other's
rounds; what sets them apart is the prune side's own inbox being pruned under its intake (see
bench/scale/prune_sides.py for when the prune side is stopped). Each side has its own inbox (a
SQLite file, or a Postgres database): a stopped side holds nothing the measured one needs.

wrk rounds alternate (baseline, prune, prune, baseline, ...) while the backlog lasts. Targets:
the prune side's req/s >= 0.9x the baseline's, its p99 <= 1.5x (medians of the per-round
ratios). The prune rate comes from ``receiver_inbox_pruned_events_total`` on the prune side's
worker (read once a second while it runs), during the prune side's rounds. After the rounds the
baseline's processes end (kept stopped, they slowed the prune side on Postgres); the run waits for
the rest of the backlog; how long all of it took counts the time the prune side ran, from
its worker's launch, not the time it was stopped. A receiver without that counter gets "n/a"
during the rounds and the inbox's count of expired events (every 10 s) afterwards. The inboxes'
counts at the end cross-check it::

    python -m bench.scale --only prune [--stored 1000000] [--stores sqlite,postgres]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench.common import Server, machine_note, need_wrk, start_stub
from bench.ingest.__main__ import POSTGRES_URL, Runner
from bench.scale import postgres
from bench.scale.prune_report import PruneFigures, report
from bench.scale.prune_sides import PRUNED_METRIC, Side, alone, make_side
from bench.scale.prune_watch import POLL_SECONDS, PruneWatch, rate, rate_text

PROGRESS_SECONDS = 10.0
#: Waiting for the backlog gives up after this long without progress.
STALL_SECONDS = 120.0


def measure_rounds(
    args: argparse.Namespace, runner: Runner, sides: dict[str, Side], watch: PruneWatch
) -> PruneFigures:
    out = PruneFigures()
    for index in range(args.rounds):
        if watch.finished_at is not None:
            print(
                f"  note: the backlog was gone before round {index + 1}: the rounds stop "
                "(a larger --stored lasts longer)"
            )
            break
        order = ["baseline", "prune"]
        ran_out = False
        for name in order if index % 2 == 0 else order[::-1]:
            others = [side for other, side in sides.items() if other != name]
            with alone(sides[name], others):
                result = runner.measure(name, sides[name].intake, args.seconds)
                after = watch.sample() if name == "prune" else None
            out.results[name].append(result)
            doing = "the prune side stopped"
            if after is not None:
                # While wrk ran (not while its requests were being signed, before it).
                pruned = rate(watch.since(after[0] - result.seconds), after)
                out.prune_rates.append(pruned)
                ran_out = watch.finished_at is not None
                doing = f"pruning {rate_text(pruned)}"
            print(
                f"  round {index + 1} {name:<8} {result.rps:>8,.0f} req/s  "
                f"p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms  "
                f"non-2xx {result.failures}  {result.cpu_text()}  {doing}",
                flush=True,
            )
        base, prune = out.results["baseline"][-1], out.results["prune"][-1]
        print(
            f"  round {index + 1} prune / baseline: req/s {prune.rps / base.rps:.2f}x, "
            f"p99 {prune.p99_ms / base.p99_ms:.2f}x"
            + ("  (the backlog ran out during this round)" if ran_out else ""),
            flush=True,
        )
    return out


def wait_for_backlog(side: Side, watch: PruneWatch, stored: int, launched: float) -> float | None:
    """When (monotonic) ``stored`` events were pruned, with progress every 10 s of the time
    ``side`` ran since its worker's launch; None when that is not known (no progress for
    STALL_SECONDS)."""
    counter = watch.latest()[1] is not None
    if not counter:
        print(
            f"  note: no {PRUNED_METRIC} on the worker's /metrics: progress from the inbox's "
            "count of expired events (every 10 s)"
        )
    last_print = last_change = time.monotonic()
    last_done = -1
    previous: tuple[float, int] | None = None
    while True:
        if counter:
            if watch.finished_at is not None:
                return watch.finished_at
            now, value = watch.latest()
            done = last_done if value is None else value
        else:
            expired = side.counts()[1]
            now, done = time.monotonic(), stored - expired
            if expired == 0:
                return now
        if done != last_done:
            last_done, last_change = done, now
        if now - last_change >= STALL_SECONDS:
            print(f"  note: no progress in {STALL_SECONDS:.0f} s: not waiting any longer")
            return None
        ran = side.running_seconds(launched, now)
        if previous is None:
            previous = (ran, done)
        elif now - last_print >= PROGRESS_SECONDS or not counter:
            recent = rate(previous, (ran, done))
            print(
                f"  {ran:6.1f} s running  {done:>10,} pruned  {stored - done:>10,} left  "
                f"{rate_text(recent)} (average {done / ran:,.0f})",
                flush=True,
            )
            last_print, previous = now, (ran, done)
        time.sleep(POLL_SECONDS if counter else PROGRESS_SECONDS)


def prune_under_load(args: argparse.Namespace, work: Path, kind: str) -> dict[str, float]:
    print(f"\n3. intake while retention prunes {args.stored:,} expired events, on {kind}")
    print(f"  {machine_note(args.loop)}")
    work = work / f"prune-{kind}"
    work.mkdir()
    sides: dict[str, Side] = {}
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    pool_dir = Path(tempfile.mkdtemp(prefix="receiver-bench-", dir=shm))
    stub: Server | None = None
    watch: PruneWatch | None = None
    figures = PruneFigures()
    try:
        try:
            stub = start_stub(args.loop, work)
            for name in ("baseline", "prune"):
                sides[name] = make_side(
                    args, work, kind, name, stub.port, keep_all=name == "baseline"
                )
            baseline, prune = sides["baseline"], sides["prune"]
            baseline.start()
            prune.intake.start()
            launched = time.monotonic()  # pruning starts as the worker opens the inbox
            prune.worker.start(timeout=60)
            watch = PruneWatch([baseline, prune], args.stored)
            at_ready = watch.latest()[1]
            print(
                f"  prune side's worker ready {watch.latest()[0] - launched:.1f} s after its "
                f"launch, {'n/a' if at_ready is None else f'{at_ready:,}'} events pruned by then"
            )
            watch.start()
            runner = Runner(args, pool_dir)
            runner.database_cpu = kind == "postgres"
            for name, side in sides.items():
                others = [other for other in sides.values() if other is not side]
                with alone(side, others):
                    runner.measure(name, side.intake, args.warmup, warmup=True)
            figures = measure_rounds(args, runner, sides, watch)
            # The prune side alone until its backlog is gone: the baseline ends. Kept stopped
            # instead (its Postgres sessions idle in a transaction), it slowed the prune side's
            # worker and pruning to a fifth until it ran again: an open transaction on the
            # server, even in another database, holds back the horizon of every snapshot taken
            # meanwhile, so the prune side's dead rows stayed (docs/postgres.md).
            baseline.stop()
            ended = wait_for_backlog(prune, watch, args.stored, launched)
            if ended is not None:
                figures.took = prune.running_seconds(launched, ended)
                figures.stopped = prune.stopped_seconds(launched, ended)
            figures.unaligned_stops = prune.stopped_unaligned
        finally:
            if watch is not None:
                watch.stop()
            for side in reversed(sides.values()):
                side.stop()
            if stub is not None:
                stub.stop()
            shutil.rmtree(pool_dir, ignore_errors=True)
        left = {name: side.counts() for name, side in sides.items()}
    finally:
        for side in sides.values():
            side.remove_inbox()
    return report(args, kind, figures, left)


def run(args: argparse.Namespace, work: Path) -> dict[str, float]:
    """Part 3 on every store of ``--stores`` (Postgres left out, with a note, when it does not
    answer)."""
    need_wrk()
    figures: dict[str, float] = {}
    for kind in args.stores.split(","):
        if kind == "postgres" and not postgres.reachable(POSTGRES_URL):
            print(f"\n  note: no PostgreSQL at {POSTGRES_URL}: 3. on postgres left out")
            continue
        figures |= prune_under_load(args, work, kind)
    return figures
