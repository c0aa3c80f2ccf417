"""bench/ingest's tables and target checks, from the rounds' wrk results."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bench.common import Table, WrkResult, median

NO_STORE = "no-store"
BASELINES = ("bare", "naive", "grouped", "grouped-postgres", "naive-fsync")
# (figure, comparison, bound): each checked when the run measured it.
TARGETS: tuple[tuple[str, str, float], ...] = (
    ("no-store/bare", ">=", 0.75),
    ("sqlite/bare", ">=", 0.55),
    ("postgres/bare", ">=", 0.55),
    ("sqlite:p99", "<=", 25.0),
    ("postgres:p99", "<=", 25.0),
)


def spread(values: Sequence[float], form: str = "{:,.0f}") -> str:
    """``median (min-max)`` of the rounds."""
    if len(values) < 2:
        return form.format(median(values))
    low, high = form.format(min(values)), form.format(max(values))
    return f"{form.format(median(values))} ({low}-{high})"


def rounds_table(results: dict[str, list[WrkResult]], order: list[list[str]]) -> str:
    table = Table(["round", "target", "req/s", "p50 ms", "p99 ms", "max ms", "non-2xx", "CPU us"])
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
                f"{r.cpu_us:.0f}",
            )
    return table.render()


def ratios(runs: list[WrkResult], base: list[WrkResult]) -> list[float]:
    """Per-round ratios of req/s: adjacent measurements share the machine's load."""
    return [a.rps / b.rps for a, b in zip(runs, base, strict=True) if b.rps]


def report(
    results: dict[str, list[WrkResult]],
    order: list[list[str]],
    out: Callable[[str], None],
    comparisons: Sequence[tuple[str, str]],
) -> dict[str, float]:
    """Prints every round, the medians with their spread and the ratios; returns the figures."""
    out(rounds_table(results, order))
    out("")
    summary = Table(
        [
            "target",
            "req/s median (min-max)",
            "p50 ms",
            "p99 ms",
            "non-2xx",
            "CPU us/req",
            "database CPU us/req",
            "x bare",
            "x no-store",
        ]
    )
    figures: dict[str, float] = {}
    for name, runs in results.items():
        cells = []
        for base in ("bare", NO_STORE):
            # (x no-store: what storing costs, for the receivers only)
            if base in results and name != base and (base == "bare" or name not in BASELINES):
                values = ratios(runs, results[base])
                figures[f"{name}/{base}"] = median(values)
                cells.append(f"{median(values):.2f}")
            else:
                cells.append("")
        figures[f"{name}:p99"] = median([r.p99_ms for r in runs])
        figures[f"{name}:non2xx"] = sum(r.failures for r in runs)
        summary.add(
            name,
            spread([r.rps for r in runs]),
            spread([r.p50_ms for r in runs], "{:.1f}"),
            spread([r.p99_ms for r in runs], "{:.1f}"),
            int(figures[f"{name}:non2xx"]),
            spread([r.cpu_us for r in runs]),
            spread([r.db_cpu_us for r in runs if r.db_cpu_us is not None])
            if any(r.db_cpu_us is not None for r in runs)
            else "",
            *cells,
        )
    out(summary.render())
    out("(x bare, x no-store: medians of the per-round ratios)")
    for name, base in comparisons:
        if name in results and base in results:
            values = ratios(results[name], results[base])
            figures[f"{name}/{base}"] = median(values)
            out(
                f"{name} / {base}: {median(values):.2f}x (per round "
                f"{', '.join(f'{x:.2f}' for x in values)})"
            )
    return figures


def check(figures: dict[str, float], receivers: Sequence[str], out: Callable[[str], None]) -> bool:
    """PASS or MISS for each target the run measured."""
    wanted = [*TARGETS, *((f"{name}:non2xx", "<=", 0.0) for name in receivers)]
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
