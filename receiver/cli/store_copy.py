"""``receiver store copy --from URL --to URL [--dry-run] [--append] [--batch N]``: copy an inbox
from one store to another (SQLite to Postgres and back, or to its own kind).

Prints a table of what each table read, wrote and skipped and whether its keys on the target
match the source; exit 0 when every table matches, 1 when something differs or the copy could
not run (one stderr line saying why), 2 for a mistake on the command line or an inbox a newer
release wrote.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from receiver.cli import store_vacuum
from receiver.cli.common import EXIT_FAILED, EXIT_USAGE, quiet_logs, run_async

if TYPE_CHECKING:
    from receiver.store.copy.run import CopyReport
    from receiver.store.copy.verify import KeyCheck

PREFIX = "receiver store copy: "

DESCRIPTION = (
    "Copy an inbox between stores: SQLite to Postgres, Postgres to SQLite, or to its own "
    "kind. Every table is copied (events with their bodies and headers, deliveries with their "
    "states, attempts and next attempt times, the timeline, the job-outcome and asset ledgers, "
    "watches, lanes and their pauses, redelivery batches), in batches, each one transaction on "
    "the target. The source is read in one consistent snapshot and never written. Both inboxes "
    "must be at this release's schema version (run `receiver migrate` on an older one); a "
    "target with no inbox yet (a new SQLite file, an empty Postgres schema) is created. At "
    "the end every table's row count and keys on the target are compared with the source; "
    "exit 1 on any difference."
)
EPILOG = (
    "Leases are copied cleared: work a receiver of the source had claimed is claimed anew by "
    "the target's receivers. To move an inbox, stop its receiver first: webhooks it answers "
    "after the copy began are not in the copy (a warning names a process that has a SQLite "
    "source open). Then start the receiver on the target: it delivers what was pending, and a "
    "webhook the upstream sends again for an event already copied is answered 2xx and not "
    "stored or delivered twice. A copy that stopped part way keeps the batches it committed: "
    "run it again with --append to finish. URLs: sqlite:///relative.db, sqlite:////abs.db, "
    "postgresql://user@host:5432/db?schema=NAME (the password is never printed; PGPASSWORD or "
    "~/.pgpass keep it off the command line)."
)


def add_parser(commands: Any) -> None:
    p = commands.add_parser(
        "store",
        help="copy a whole inbox to another store (SQLite, Postgres), or vacuum a SQLite one",
        description="Work on a whole inbox. `receiver store copy --help` explains the copy, "
        "`receiver store vacuum --help` the vacuum.",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    store_vacuum.add_parser(actions)
    copy = actions.add_parser(
        "copy",
        help="copy an inbox between stores (SQLite to Postgres and back)",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    copy.add_argument(
        "--from", dest="source", required=True, metavar="URL", help="the inbox to copy"
    )
    copy.add_argument(
        "--to",
        dest="target",
        required=True,
        metavar="URL",
        help="where to copy it: an inbox with no rows, or none yet (then created)",
    )
    copy.add_argument(
        "--dry-run",
        action="store_true",
        help="print each table's rows that would be copied; write nothing, create nothing",
    )
    copy.add_argument(
        "--append",
        action="store_true",
        help="copy into a target that already has rows: rows whose key is already there are "
        "skipped and counted (to finish a copy that stopped part way)",
    )
    copy.add_argument(
        "--batch",
        type=_batch_size,
        default=5000,
        metavar="N",
        help="rows per batch, each one transaction on the target (default 5000)",
    )


def _batch_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number of rows, at least 1")
    return value


def run(args: argparse.Namespace) -> int:
    if args.action == "vacuum":
        return store_vacuum.run(args)
    from receiver.errors import ReceiverError, StoreNewer
    from receiver.store.copy.locations import BadLocation, parse_location
    from receiver.store.copy.run import CopyOptions, copy_inbox

    try:
        source = parse_location("--from", args.source)
        target = parse_location("--to", args.target)
    except BadLocation as exc:
        return _fail(str(exc), EXIT_USAGE)
    if source.same_inbox(target):
        return _fail("--from and --to name the same inbox", EXIT_USAGE)
    quiet_logs()
    options = CopyOptions(source, target, args.dry_run, args.append, args.batch)
    try:
        report: CopyReport = run_async(copy_inbox(options, _say))
    except StoreNewer as exc:
        return _fail(exc.message, EXIT_USAGE)
    except ReceiverError as exc:
        return _fail(exc.message, EXIT_FAILED)
    for line in report_lines(report):
        print(line)
    if report.problems:
        return _fail("the target differs from the source: " + "; ".join(report.problems))
    return 0


def _say(text: str) -> None:
    print(PREFIX + text, file=sys.stderr, flush=True)


def _fail(text: str, code: int = EXIT_FAILED) -> int:
    _say(text)
    return code


def report_lines(report: CopyReport) -> list[str]:
    """The report a copy (or a dry run) prints."""
    from receiver.store.schema_version import SCHEMA_VERSION

    options = report.options
    dry = options.dry_run
    if report.target_version == 0:
        state = "no inbox yet: would be created" if dry else "had no inbox: created"
        state += f" at schema version {SCHEMA_VERSION}"
    elif options.append:
        state = "holds rows: --append adds only what it lacks"
    else:
        state = "empty"
    lines = [
        f"from: {options.source.shown} (schema version {SCHEMA_VERSION})",
        f"to:   {options.target.shown} ({state})",
    ]
    head: tuple[str, ...]
    rows: list[tuple[str, ...]]
    if options.dry_run:
        head = ("TABLE", "ROWS", "WOULD COPY", "WOULD SKIP")
        rows = [(t.name, f"{t.rows:,}", f"{t.written:,}", f"{t.skipped:,}") for t in report.tables]
    else:
        head = ("TABLE", "READ", "WRITTEN", "SKIPPED", "TARGET", "KEYS (SHA-256)")
        rows = [
            (
                t.name,
                f"{t.read:,}",
                f"{t.written:,}",
                f"{t.skipped:,}",
                f"{t.check.target_rows:,}" if t.check else "-",
                _keys(t.check, append=options.append) if t.check else "-",
            )
            for t in report.tables
        ]
    lines += _aligned(head, rows, text_last=not options.dry_run)
    total = sum(t.rows for t in report.tables)
    if options.dry_run:
        lines.append(f"{total:,} rows in the source; nothing was written (--dry-run)")
        return lines
    leases = [f"{t.name} {t.leases:,}" for t in report.tables if t.leases]
    if leases:
        lines.append(
            "leases cleared (the target's receivers claim that work anew): " + ", ".join(leases)
        )
    rate = total / report.seconds if report.seconds > 0 else 0.0
    verdict = (
        "the target differs from the source"
        if report.problems
        else "every table's rows and keys on the target match the source"
    )
    lines.append(f"{total:,} rows in {report.seconds:.1f} s ({rate:,.0f} rows/s); {verdict}")
    return lines


def _aligned(head: tuple[str, ...], rows: list[tuple[str, ...]], *, text_last: bool) -> list[str]:
    """A table: the first column (and the last, when ``text_last``) left-aligned, numbers
    right-aligned."""
    widths = [max(len(row[n]) for row in [head, *rows]) for n in range(len(head))]
    lines = []
    for row in [head, *rows]:
        cells = []
        for n, (cell, width) in enumerate(zip(row, widths, strict=True)):
            left = n == 0 or (text_last and n == len(row) - 1)
            cells.append(cell.ljust(width) if left else cell.rjust(width))
        lines.append("  ".join(cells).rstrip())
    return lines


def _keys(check: KeyCheck, *, append: bool) -> str:
    """``ok`` and the digest's start when the target's keys are the source's (with --append:
    when it has every one of them), else what differs."""
    if check.source_digest == check.target_digest:
        return f"ok {check.target_digest[:12]}"
    if append and not check.missing:
        return f"ok, and {check.extra:,} rows of its own"
    parts = []
    if check.missing:
        parts.append(f"{check.missing:,} missing")
    if check.extra and not append:
        parts.append(f"{check.extra:,} not in the source")
    return ", ".join(parts)
