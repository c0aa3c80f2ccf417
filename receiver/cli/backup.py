"""``receiver backup`` and ``receiver restore``: a consistent copy of a SQLite inbox taken while
the receiver serves, and putting one back while nothing uses the inbox.

``backup`` exits 0 with one summary line, 1 when no copy was kept (one stderr line saying why),
2 for a mistake on the command line, an inbox a newer release wrote, or a store this command
does not copy: for a Postgres inbox it prints the ``pg_dump`` and ``pg_restore`` commands for
that store's schema instead. ``restore`` prints each step it takes, one line each; exit 1 when
it refused or stopped (nothing lost: the inbox it replaces is kept beside it), 2 as ``backup``.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from receiver.cli.common import EXIT_USAGE, quiet_logs, settings_from, with_config
from receiver.cli.pg_tools import pg_commands
from receiver.cli.progress_line import ProgressLine

DOCS = "docs/operations.md#backups-and-restores"

BACKUP_DESCRIPTION = (
    "Write a consistent copy of the SQLite inbox while the receiver serves (intake and "
    "delivery go on): every event answered 2xx before the backup began is in it. The copy is "
    "written to DEST.partial, checked (integrity, schema version, events), synced to disk and "
    "renamed to DEST; it is a SQLite file `receiver restore` puts back. An inbox at an older "
    "schema version is refused (run `receiver migrate` first). For a Postgres inbox this "
    "prints the pg_dump and pg_restore commands for its schema, and exits 2."
)
BACKUP_EPILOG = (
    "DEST may be a directory: the copy is then <dir>/<inbox name>-<UTC time>.db, and --keep N "
    "keeps the newest N such copies there (for a timer or a cron job). A DEST file that exists "
    "is never replaced. On a terminal (or with --progress), the copy's size so far is shown "
    "on stderr once a second."
)
RESTORE_DESCRIPTION = (
    "Put a copy of a SQLite inbox (a `receiver backup`) in the inbox's place. The copy is "
    "checked first (a SQLite inbox, integrity ok, a schema version this release knows) and "
    "never written. Refused while any process uses the inbox: stop every `receiver serve` "
    "first. The inbox it replaces is moved aside to <inbox>.before-restore-<UTC time>, never "
    "deleted. A copy at an older schema version is migrated at the next start (or by "
    "`receiver migrate`). Each step is printed."
)


def _keep(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


class BackupCommand:
    """``receiver backup [--config PATH] DEST [--keep N] [--progress]``."""

    def add_parser(self, commands: Any) -> None:
        p = commands.add_parser(
            "backup",
            help="write a consistent copy of the SQLite inbox while the receiver serves",
            description=BACKUP_DESCRIPTION,
            epilog=BACKUP_EPILOG,
        )
        with_config(p)
        p.add_argument(
            "dest",
            metavar="DEST",
            nargs="?",
            help="a new file, or a directory (not needed to print the Postgres commands)",
        )
        p.add_argument(
            "--keep",
            type=_keep,
            metavar="N",
            help="with DEST a directory: keep the newest N backups of this inbox there, "
            "remove the older ones",
        )
        p.add_argument(
            "--progress",
            action="store_true",
            help="show the progress on stderr also when it is not a terminal",
        )

    def run(self, args: argparse.Namespace) -> int:
        settings = settings_from(args)
        quiet_logs()
        url = settings.store.url
        if not url.startswith("sqlite:"):
            return _not_sqlite("backup", settings)
        from receiver.store.sqlite import sqlite_path
        from receiver.store.sqlite.backup import back_up

        if args.dest is None:
            print(
                "receiver backup: DEST is missing: name a new file, or a directory to put the "
                "copy in (see receiver backup --help)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        dest = Path(args.dest)
        if args.keep is not None and not dest.is_dir():
            print(
                f"receiver backup: --keep needs DEST to be a directory; {dest} is not one",
                file=sys.stderr,
            )
            return EXIT_USAGE
        progress = Progress(sys.stderr) if args.progress or sys.stderr.isatty() else None
        with _sigterm_as_interrupt():
            try:
                done = back_up(sqlite_path(url), dest, keep=args.keep, progress=progress)
            except KeyboardInterrupt:
                print("receiver backup: stopped; the partial copy was removed", file=sys.stderr)
                return 130
            finally:
                if progress is not None:
                    progress.finish()
        print(
            f"backup {done.path}: {_size(done.size)} ({done.size} bytes), {done.events} "
            f"events, schema version {done.version}, {done.seconds:.1f} s"
        )
        for old in done.removed:
            print(f"removed the older backup {old} (--keep {args.keep})")
        return 0


class RestoreCommand:
    """``receiver restore [--config PATH] SRC``."""

    def add_parser(self, commands: Any) -> None:
        p = commands.add_parser(
            "restore",
            help="put a backup in the SQLite inbox's place (while no receiver runs on it)",
            description=RESTORE_DESCRIPTION,
        )
        with_config(p)
        p.add_argument("src", metavar="SRC", help="the copy to restore (a `receiver backup`)")

    def run(self, args: argparse.Namespace) -> int:
        settings = settings_from(args)
        quiet_logs()
        url = settings.store.url
        if not url.startswith("sqlite:"):
            return _not_sqlite("restore", settings)
        from receiver.store.sqlite import sqlite_path
        from receiver.store.sqlite.restore import restore

        restore(sqlite_path(url), Path(args.src), say=_say)
        return 0


def _say(line: str) -> None:
    print(line, flush=True)


def _not_sqlite(command: str, settings: Any) -> int:
    """What ``backup`` and ``restore`` do for an inbox that is not a SQLite file: exit 2."""
    url = settings.store.url
    if url.startswith("memory://"):
        print(
            f"receiver {command}: a memory:// inbox lives inside the running receiver and ends "
            "with it: there is nothing to copy",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if command == "restore":
        print(
            "receiver restore: the inbox is on Postgres: put a pg_dump of its schema back with "
            "pg_restore (`receiver backup` prints both commands for this store; see "
            f"{DOCS})",
            file=sys.stderr,
        )
        return EXIT_USAGE
    for line in pg_commands(settings.store):
        print(line)
    print(
        "receiver backup: the inbox is on Postgres: back it up with pg_dump, not this command "
        f"(its commands for this store are printed on stdout; see {DOCS})",
        file=sys.stderr,
    )
    return EXIT_USAGE


class Progress(ProgressLine):
    """``receiver backup: 120.0 MB of about 260.0 MB copied (46%)``, redrawn in place on a
    terminal, one line each time otherwise; called at most once a second."""

    def __call__(self, done: int, total: int) -> None:
        percent = min(99, 100 * done // total) if total else 0
        self.show(f"receiver backup: {_size(done)} of about {_size(total)} copied ({percent}%)")


def _size(n: int) -> str:
    """``n`` bytes, for a person: ``812 bytes``, ``12.3 MB``."""
    if n < 1000:
        return f"{n} bytes"
    value, unit = n / 1000, "kB"
    for bigger in ("MB", "GB"):
        if value < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{value:.1f} {unit}"


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While inside: SIGTERM (a service manager stopping the job) stops the copy as Ctrl-C
    does, so the partial file is removed."""

    def stop(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


BACKUP = BackupCommand()
RESTORE = RestoreCommand()
