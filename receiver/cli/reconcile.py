"""``receiver reconcile``: deliver a collection's completed assets that no sink has delivered.

Safe while the receiver serves: the run only adds events to the inbox (ids stable per job, item
or asset and its set of assets), and the receiver's workers deliver them through the normal
lanes. A progress bar goes to stderr, the summary to stdout; the exit code is 1 when no asset
could be judged.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from receiver.cli.common import (
    EXIT_USAGE,
    quiet_logs,
    run_async,
    store_settings_from,
    with_config,
)
from receiver.cli.progress_line import ProgressLine
from receiver.config.settings import Settings
from receiver.humantime import parse_since
from receiver.store.pull import valid_job_id

if TYPE_CHECKING:  # the command's body imports it: `receiver --help` needs no HTTP client
    from receiver.pull.reconcile import ReconcileSummary

BAR_WIDTH = 30


def add_parser(commands: Any) -> None:
    p = with_config(
        commands.add_parser(
            "reconcile",
            help="deliver a collection's completed assets that no sink has delivered yet",
        )
    )
    p.add_argument("--collection", required=True, metavar="ID", help="the collection id")
    p.add_argument(
        "--since",
        metavar="T",
        help="only assets created since T: an ISO 8601 time, or an age such as 48h or 7d",
    )
    p.add_argument("--dry-run", action="store_true", help="count only; store nothing")


def run(args: argparse.Namespace) -> int:
    if not valid_job_id(args.collection):  # collection ids are UUIDs as job ids are
        print(
            f"receiver: reconcile: {args.collection[:80]!r} is not a collection id (a UUID)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    since = None
    if args.since is not None:
        try:
            since = parse_since(args.since, now=time.time())
        except ValueError:
            print(
                f"receiver: reconcile: --since {args.since[:80]!r} is neither an ISO 8601 time "
                "nor an age such as 48h",
                file=sys.stderr,
            )
            return EXIT_USAGE
    settings = store_settings_from(args, "reconcile", "[[reconcile]]")
    quiet_logs()
    bar = ProgressBar(sys.stderr)
    summary: ReconcileSummary = run_async(
        _reconcile(settings, args.collection.lower(), since, args.dry_run, bar)
    )
    bar.finish()
    print(summary.line())
    if summary.failed:
        print(
            f"receiver: reconcile: none of the {summary.seen} assets could be judged "
            "(no id or no type): is the API base URL right?",
            file=sys.stderr,
        )
        return 1
    return 0


async def _reconcile(
    settings: Settings, collection: str, since: float | None, dry_run: bool, bar: ProgressBar
) -> ReconcileSummary:
    import aiohttp

    from receiver.pull.reconcile import Reconciler
    from receiver.store import open_store
    from receiver.upstream.client import UpstreamClient

    store = open_store(settings.store)
    await store.open()
    try:
        async with aiohttp.ClientSession() as session:
            upstream = UpstreamClient(
                session=session,
                base_url=settings.api.base_url,
                api_key=settings.api.api_key,
                timeout=settings.api.timeout_seconds,
                api_version=settings.api.version,
            )
            reconciler = Reconciler(settings=settings, store=store, upstream=upstream)
            return await reconciler.run(
                collection, since=since, dry_run=dry_run, progress=bar.update
            )
    finally:
        await store.close()


class ProgressBar(ProgressLine):
    """``[#####.....] 120/250 assets, page 2`` redrawn in place on a terminal; one line per
    page otherwise (logs, CI)."""

    def update(self, summary: ReconcileSummary) -> None:
        total = summary.total
        if total:
            done = min(summary.seen, total)
            filled = BAR_WIDTH * done // total
            bar = "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "] "
            text = f"{bar}{done}/{total} assets, page {summary.pages}"
        else:
            text = f"{summary.seen} assets, page {summary.pages}"
        if summary.retries:
            text += f" (retried {summary.retries}x)"
        self.show(text)
