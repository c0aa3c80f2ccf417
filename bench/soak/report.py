"""The soak's report of one store: the start, middle and end samples in a table, whether the
size, the RSS and the fds level off, each table of the inbox at the end, and the samples' CSV."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sqlite3
from pathlib import Path
from typing import Any

from bench.common import Table
from bench.soak.figures import bloat, counts, na
from bench.soak.postgres_stats import PG_TABLES, autovacuum_settings, table_options
from bench.soak.samples import Sample, Sampler, sockets
from bench.soak.sqlite_stats import inbox_tables
from receiver.store.retention_timing import BENCH_ENV as RETENTION_ENV

#: "Levels off": the end's figure at most this many times the middle's.
LEVEL_RATIO = 1.10
CSV_FIELDS = [f.name for f in dataclasses.fields(Sample) if f.name != "note"]


def csv_row(sample: Sample) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(sample).items() if k in CSV_FIELDS}


def pick(samples: list[Sample], retention: float) -> dict[str, Sample] | None:
    """Start (the first sample after one full retention period), middle (the sample nearest
    halfway from the start to the end) and end (the last sample taken while the traffic ran:
    the one after it sees the sender's connections closed); None before any steady one."""
    running = [s for s in samples if s.during_traffic] or samples
    end = running[-1]
    steady = [s for s in running if s.t >= retention]
    if not steady or steady[0] is end:
        return None
    start = steady[0]
    halfway = (start.t + end.t) / 2
    middle = min(steady[:-1], key=lambda s: abs(s.t - halfway))
    return {"start": start, "middle": middle, "end": end}


def level(name: str, middle: float | None, end: float | None) -> tuple[bool, str]:
    if middle is None or end is None:
        return False, f"MISS  {name}: not measured"
    ratio = end / middle if middle > 0 else (1.0 if end <= 0 else float("inf"))
    ok = ratio <= LEVEL_RATIO
    verdict = "PASS" if ok else "MISS"
    return ok, f"{verdict}  {name} levels off: end / middle {ratio:.2f} (<= {LEVEL_RATIO:.2f})"


def report(
    store: str, sampler: Sampler, args: argparse.Namespace, extra: list[str] | None = None
) -> bool:
    samples = sampler.samples
    traffic = sampler.traffic
    print(
        f"\n  {store}: {traffic.sent:,} webhooks sent, {traffic.ok:,} answered 2xx, "
        f"{traffic.non_2xx:,} non-2xx{counts(traffic.statuses)}, "
        f"{traffic.failed:,} without an answer{counts(traffic.errors)}; "
        f"at most {traffic.behind:.2f} s behind the schedule"
    )
    chosen = pick(samples, args.retention)
    if chosen is None:
        print(
            f"  MISS  {store}: the run ended before one retention period ({args.retention:g} s) "
            "had passed: no steady state to judge"
        )
        return False
    size_name = "file bytes" if store == "sqlite" else "tables bytes"
    headers = ["sample", "t (s)", size_name, "RSS MiB", "fds (sockets)", "events stored"]
    headers.append("pruned total")
    if store == "sqlite":
        headers += ["wal bytes", "free bytes", "vacuumed bytes"]
    else:
        headers += ["events bytes", "deliveries bytes", "dead/live"]
    table = Table(headers)
    for label, s in chosen.items():
        row: list[object] = [
            label,
            f"{s.t:.0f}",
            na(s.size),
            f"{s.rss_mib:.1f}",
            f"{s.fds} ({s.fds_sockets})",
            na(s.events),
            na(s.pruned_total),
        ]
        if store == "sqlite":
            row += [na(s.wal_bytes), na(s.metric_free_bytes), na(s.vacuumed_bytes_total)]
        else:
            row += [na(s.pg_events_bytes), na(s.pg_deliveries_bytes), bloat(s.pg_dead, s.pg_live)]
        table.add(*row)
    print("\n" + "\n".join("  " + line for line in table.render().splitlines()))
    print()
    for label, s in chosen.items():
        print(
            f"  {label:<6} t={s.t:.0f} s: {s.note}; os.getloadavg() {s.load1:.2f} "
            f"{s.load5:.2f} {s.load15:.2f}"
        )
    print()
    for label, s in chosen.items():
        print(f"  {label:<6} sockets by peer: {sockets(s)}")
    middle, end = chosen["middle"], chosen["end"]
    verdicts = [
        level(f"{store} {size_name}", middle.size, end.size),
        level(f"{store} RSS", middle.rss_mib, end.rss_mib),
        level(f"{store} open fds", middle.fds, end.fds),
    ]
    answered = traffic.non_2xx == 0 and traffic.failed == 0
    verdicts.append(
        (
            answered,
            f"{'PASS' if answered else 'MISS'}  {store} webhooks: {traffic.non_2xx} non-2xx, "
            f"{traffic.failed} without an answer (target 0)",
        )
    )
    print()
    for _ok, line in verdicts:
        print(f"  {line}")
    for line in extra or []:
        print(f"  {line}")
    for line in notes(chosen, args):
        print(f"  note: {line}")
    return all(ok for ok, _ in verdicts)


def notes(chosen: dict[str, Sample], args: argparse.Namespace) -> list[str]:
    """What makes the figures hard to read: a receiver without the knob, a backlog."""
    said: list[str] = []
    end = chosen["end"]
    steady = args.rate * args.retention * 1.1  # a retention cycle's worth above the retention
    if end.events is not None and end.events > 1.5 * steady:
        said.append(
            f"{end.events:,} events stored against about {steady:,.0f} in a steady state: the "
            f"receiver did not prune at {args.retention:g} s (does it read {RETENTION_ENV}?); "
            "these figures show growth, not a steady state"
        )
    if end.pruned_total is None:
        said.append(
            "the receiver exports no receiver_inbox_pruned_events_total (nor, where n/a, "
            "receiver_inbox_file_bytes / receiver_inbox_free_bytes)"
        )
    if end.pending is not None and end.pending > args.rate * 10:
        said.append(
            f"{end.pending:,} events pending at the end: processing fell behind the arrivals"
        )
    return said


def sqlite_table_lines(path: Path) -> list[str]:
    """Each table of the SQLite inbox at the end: its rows and its bytes with its indexes, the
    largest first: which of them grows when the file does."""
    try:
        tables = inbox_tables(path)
    except sqlite3.Error as exc:
        return [f"note: the inbox's tables not read: {exc}"]
    detail = Table(["table", "rows", "bytes (with its indexes)"])
    for name in sorted(tables.rows, key=lambda t: -tables.bytes[t]):
        detail.add(name, f"{tables.rows[name]:,}", f"{tables.bytes[name]:,}")
    detail.add("(free pages)", "", f"{tables.free_bytes:,}")
    return [
        "the inbox's tables at the end:",
        *("  " + line for line in detail.render().splitlines()),
    ]


async def pg_bloat_lines(
    conn: Any, sampler: Sampler, chosen: dict[str, Sample] | None
) -> list[str]:
    """The Postgres bloat line, each table's figures at the end, and the server's settings."""
    lines: list[str] = []
    settings = await autovacuum_settings(conn)
    options = await table_options(conn, sampler.schema or "")
    if chosen is not None:
        middle, end = chosen["middle"], chosen["end"]
        parts = []
        for name in PG_TABLES:
            before, after = (
                bloat(getattr(s, f"pg_{name}_dead"), getattr(s, f"pg_{name}_live"))
                for s in (middle, end)
            )
            parts.append(f"{name} {before} -> {after}")
        parts.append(
            f"every table {bloat(middle.pg_dead, middle.pg_live)} -> "
            f"{bloat(end.pg_dead, end.pg_live)}"
        )
        lines.append("bloat (dead / live rows, middle -> end): " + ", ".join(parts))
    now = datetime.datetime.now(datetime.UTC)
    detail = Table(
        ["table", "bytes", "live", "dead", "dead/live", "autovacuums", "last autovacuum", "options"]
    )
    for name, t in sorted(sampler.pg_last.items(), key=lambda kv: -kv[1]["bytes"]):
        last = t.get("last_autovacuum")
        detail.add(
            name,
            f"{t['bytes']:,}",
            na(t.get("live")),
            na(t.get("dead")),
            bloat(t.get("dead"), t.get("live")),
            na(t.get("autovacuum_count")),
            "never" if last is None else f"{(now - last).total_seconds():.0f} s ago",
            ",".join(options.get(name) or []) or "-",
        )
    lines.append("the schema's tables at the end:")
    lines += ["  " + line for line in detail.render().splitlines()]
    lines.append(
        "server: "
        + ", ".join(f"{k} {v}" for k, v in sorted(settings.items()))
        + (
            "  (autovacuum is off on this server: dead rows stay until a VACUUM)"
            if settings.get("autovacuum") == "off"
            else ""
        )
    )
    return lines
