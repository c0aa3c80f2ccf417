"""bench-scale part 3's report: each side's rounds, the prune rate while the prune side ran
alone, the time the whole backlog took, and the verdicts on the targets."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from bench.common import Table, WrkResult, machine_note, median
from bench.ingest.report import spread
from bench.scale.prune_sides import RETENTION_HOURS
from bench.scale.prune_watch import rate_text

TARGET_RPS_RATIO = 0.9
TARGET_P99_RATIO = 1.5


@dataclass
class PruneFigures:
    """What a run measured."""

    results: dict[str, list[WrkResult]] = field(
        default_factory=lambda: {"baseline": [], "prune": []}
    )
    #: The prune rate during each of the prune side's rounds (None: no counter).
    prune_rates: list[float | None] = field(default_factory=list)
    #: Seconds the prune side ran (was not stopped) from its worker's launch until the whole
    #: backlog was pruned; None when not known.
    took: float | None = None
    #: Seconds it was stopped in that time.
    stopped: float = 0.0
    #: Times it was stopped without a retention step seen ending first.
    unaligned_stops: int = 0


def side_table(kind: str, results: dict[str, list[WrkResult]]) -> Table:
    columns = ["side", "req/s median (min-max)", "p50 ms", "p99 ms", "non-2xx"]
    columns += ["receiver CPU us/req", "database CPU us/req"]
    table = Table(columns if kind == "postgres" else columns[:-1])
    for name, runs in results.items():
        if not runs:
            continue
        table.add(
            "pruning" if name == "prune" else "baseline (keeps all)",
            spread([r.rps for r in runs]),
            spread([r.p50_ms for r in runs], "{:.1f}"),
            spread([r.p99_ms for r in runs], "{:.1f}"),
            sum(r.failures for r in runs),
            spread([r.cpu_us for r in runs]),
            *([spread([r.db_cpu_us or 0.0 for r in runs])] if kind == "postgres" else []),
        )
    return table


def report(
    args: argparse.Namespace,
    kind: str,
    run: PruneFigures,
    left: dict[str, tuple[int, int]],
) -> dict[str, float]:
    results = run.results
    table = side_table(kind, results)
    if table.rows:
        print(table.render())
    for name, (total, expired) in left.items():
        print(
            f"  {name} inbox after the run: {total:,} events, {expired:,} of them past "
            f"{RETENTION_HOURS:g} h"
            + (f" (expected {args.stored:,})" if name == "baseline" else " (expected 0)")
        )
    rates = [r for r in run.prune_rates if r is not None]
    if results["prune"]:
        print(
            "  prune rate during the prune side's rounds (it runs alone then): "
            + (
                f"{rate_text(median(rates))} median (per round "
                f"{', '.join(rate_text(r) for r in run.prune_rates)})"
                if rates
                else "n/a"
            )
        )
    if run.unaligned_stops:
        print(
            f"  note: the prune side was stopped {run.unaligned_stops} time(s) without a "
            "retention step seen ending first: if one was under way, its worker waited four "
            "times the stop after it"
        )
    figures: dict[str, float] = {}
    if run.took is None:
        print(f"  the whole backlog of {args.stored:,} events: n/a")
    else:
        print(
            f"  the whole backlog of {args.stored:,} events pruned in {run.took:.1f} s of the "
            f"prune side's running time (from its worker's launch, not counting the "
            f"{run.stopped:.1f} s it was stopped while the baseline's warm-up and rounds ran): "
            f"{args.stored / run.took:,.0f} events/s on average"
        )
        figures |= {f"{kind}_prune_seconds": run.took, f"{kind}_prune_rate": args.stored / run.took}
    if not results["prune"]:
        print(f"n/a   {kind}: no round ran while the backlog lasted")
    else:
        pairs = list(zip(results["prune"], results["baseline"], strict=True))
        rps = [p.rps / b.rps for p, b in pairs]
        p99 = [p.p99_ms / b.p99_ms for p, b in pairs]
        print(
            f"{'PASS' if median(rps) >= TARGET_RPS_RATIO else 'MISS'}  {kind} intake pruning / "
            f"baseline: {median(rps):.2f}x (per round {', '.join(f'{r:.2f}' for r in rps)}; "
            f"target >= {TARGET_RPS_RATIO})"
        )
        print(
            f"{'PASS' if median(p99) <= TARGET_P99_RATIO else 'MISS'}  {kind} p99 pruning / "
            f"baseline: {median(p99):.2f}x (per round {', '.join(f'{r:.2f}' for r in p99)}; "
            f"target <= {TARGET_P99_RATIO})"
        )
        figures |= {f"{kind}_prune_rps_ratio": median(rps), f"{kind}_prune_p99_ratio": median(p99)}
    if rates:
        figures[f"{kind}_prune_rate_under_load"] = median(rates)
    print(f"  {machine_note(args.loop)}")
    return figures
