"""``receiver store vacuum [--config PATH]``: rewrite a SQLite inbox whole while no receiver
runs on it, giving back every free page, and let an inbox made before incremental vacuum give
pages back from then on.

Exit 0 with one summary line; 1 when it was refused (in use) or could not run (one stderr line
saying why; the inbox is as it was); 2 for a store this command does not vacuum (memory,
Postgres: one line saying what to do instead).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from receiver.cli.common import EXIT_FAILED, EXIT_USAGE, quiet_logs, settings_from, with_config

PREFIX = "receiver store vacuum: "
DESCRIPTION = (
    "Rewrite the SQLite inbox whole (VACUUM), giving every free page back to the file system, "
    "and make it give back the space retention frees from then on (incremental vacuum: an "
    "inbox this release creates does so already; one made by an earlier release needs this "
    "once). Refused while any process uses the inbox: stop every `receiver serve` first. It "
    "needs free space of about the file's size, in the temporary directory and beside the "
    "inbox, and takes about a minute a GB; stopped or short of space, it leaves the inbox "
    "as it was."
)


def add_parser(actions: Any) -> None:
    p = actions.add_parser(
        "vacuum",
        help="rewrite a SQLite inbox, giving free space back (while no receiver runs on it)",
        description=DESCRIPTION,
    )
    with_config(p)


def run(args: argparse.Namespace) -> int:
    from receiver.errors import StoreError
    from receiver.store.sqlite import sqlite_path
    from receiver.store.sqlite.space import vacuum

    settings = settings_from(args)
    url = settings.store.url
    if not url.startswith("sqlite:"):
        kind = "memory://" if url.startswith("memory://") else "Postgres"
        _say(
            f"the inbox is {kind}, not a SQLite file: "
            + (
                "it lives inside the running receiver"
                if kind == "memory://"
                else "Postgres reuses the space of deleted rows after autovacuum (see "
                "docs/postgres.md); there is nothing to vacuum here"
            )
        )
        return EXIT_USAGE
    quiet_logs()
    path = sqlite_path(url)
    try:
        done = vacuum(path, _say)
    except StoreError as exc:
        _say(exc.message)
        return EXIT_FAILED
    how = (
        "converted to incremental vacuum: retention gives freed space back from now on"
        if done.converted
        else "already gave freed space back; every free page is returned now"
    )
    print(
        f"vacuumed {path}: {_mib(done.before)} -> {_mib(done.after)} in {done.seconds:.1f} s; "
        + how
    )
    return 0


def _mib(size: int) -> str:
    return f"{size / 1048576:,.1f} MiB"


def _say(text: str) -> None:
    print(PREFIX + text, file=sys.stderr, flush=True)
