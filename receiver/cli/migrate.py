"""``receiver migrate``: create or upgrade the inbox schema, then exit; ``--dry-run`` shows what
would run, ``migrate status`` where the schema stands.

``migrate status`` exits 0 when the inbox is at this release's schema version, 1 while it is
behind (migrations pending), 2 when a newer release wrote it. ``migrate`` and ``--dry-run``
refuse an inbox a newer release wrote (exit 2, one line naming both versions) and change
nothing in it.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from receiver import __version__
from receiver.cli.common import EXIT_FAILED, EXIT_USAGE, run_async, settings_from, with_config
from receiver.logs import configure_logging

if TYPE_CHECKING:
    from receiver.store.migrate import SchemaStatus

DESCRIPTION = (
    "Apply the inbox's pending schema migrations (SQLite or Postgres), all in one transaction, "
    "whatever store.auto_migrate says, then exit; safe while replicas run. Before migrating a "
    "SQLite inbox that holds data, a copy of it is written beside it "
    "(<inbox>.before-migrate-v<from>-<UTC time>; the newest 3 are kept). An inbox written by "
    "a newer release is refused (exit 2) and left as it was."
)
STATUS_HELP = (
    "print the inbox's schema version, this release's, and what is pending; exit 0 when "
    "current, 1 while behind, 2 when a newer release wrote the inbox; changes nothing (a "
    "SQLite file that does not exist yet is not created)"
)


def add_parser(commands: Any) -> None:
    p = commands.add_parser(
        "migrate",
        help="create or upgrade the inbox schema, then exit (status, --dry-run)",
        description=DESCRIPTION,
    )
    p.add_argument("action", nargs="?", choices=["status"], metavar="status", help=STATUS_HELP)
    with_config(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the store, its schema version and each migration that would run; "
        "change nothing",
    )


def run(args: argparse.Namespace) -> int:
    """Apply the inbox schema migrations (also when store.auto_migrate is false), print what is
    pending, or where the schema stands."""
    if args.action == "status" and args.dry_run:
        print(
            "receiver: migrate status: changes nothing already; --dry-run is for migrate alone",
            file=sys.stderr,
        )
        return EXIT_USAGE
    settings = settings_from(args)
    configure_logging(settings.log.level, settings.log.format)
    from receiver.store.migrate import in_memory, migrate_store, schema_status

    if in_memory(settings.store):
        print(f"inbox {settings.store.url}: kept in memory, nothing to migrate")
        return 0
    if args.action == "status":
        status = run_async(schema_status(settings.store))
        for line in status_lines(status):
            print(line)
        if status.newer:
            return EXIT_USAGE
        return EXIT_FAILED if status.pending else 0
    if args.dry_run:
        status = run_async(schema_status(settings.store))
        if status.newer:
            raise status.refusal()
        for line in plan_lines(status):
            print(line)
        return 0
    done = run_async(migrate_store(settings.store))
    if not done.applied:
        print(f"inbox {done.inbox}: already at version {done.after}")
        return 0
    applied = ", ".join(str(v) for v in done.applied)
    print(
        f"inbox {done.inbox}: migrated from version {done.before} to {done.after} "
        f"(applied {applied})"
    )
    if done.backup is not None:
        print(f"the inbox as it was before is kept at {done.backup}")
    return 0


def _head(status: SchemaStatus) -> list[str]:
    found = "" if status.exists else " (no file yet: `receiver migrate` creates it)"
    return [
        f"inbox: {status.inbox}",
        f"schema version: {status.version}{found}",
        f"this release: {__version__}, schema version {status.latest}",
    ]


def _listed(migrations: tuple[tuple[int, str], ...]) -> list[str]:
    return [f"  {version}  {description}" for version, description in migrations]


def status_lines(status: SchemaStatus) -> list[str]:
    """``migrate status``'s report."""
    lines = _head(status)
    if status.newer:
        return [
            *lines,
            "pending: none; a newer release wrote this inbox and this one does not open it: "
            "upgrade the receiver or restore a backup taken before that upgrade",
        ]
    if not status.pending:
        return [*lines, "pending: none, up to date"]
    count = len(status.pending)
    return [
        *lines,
        f"pending: {count} migration{'s' if count > 1 else ''}",
        *_listed(status.pending),
        "run `receiver migrate` to apply them (or start with store.auto_migrate = true)",
    ]


def plan_lines(status: SchemaStatus) -> list[str]:
    """``migrate --dry-run``'s report."""
    lines = _head(status)
    if not status.pending:
        return [*lines, "nothing to apply: the inbox is at this release's schema version"]
    count = len(status.pending)
    lines += [
        f"would apply {count} migration{'s' if count > 1 else ''}, in one transaction:",
        *_listed(status.pending),
    ]
    if status.copy_before:
        lines.append(f"would first write a copy of the inbox to {status.copy_before}")
    return [*lines, "nothing was changed (--dry-run)"]
