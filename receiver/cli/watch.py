"""``receiver watch``: put jobs on the durable watch list, whether or not the receiver runs.

The running receiver's poller (or the next one to start) follows each job with the upstream's
long-poll and delivers its outcome like a webhook; ``GET /admin/watch`` shows how each watch
ended.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from receiver.cli.common import (
    EXIT_USAGE,
    quiet_logs,
    run_async,
    store_settings_from,
    with_config,
)
from receiver.config.settings import Settings
from receiver.pull.watch import BadJobId, check_job_ids, watch_jobs
from receiver.store.pull import WatchRecord

NOTES = {
    "watching": "watching",
    "done": "done (its outcome was already delivered)",
}


def add_parser(commands: Any) -> None:
    p = with_config(
        commands.add_parser(
            "watch", help="follow jobs that send no webhook until they finish (pull mode)"
        )
    )
    p.add_argument("job_ids", nargs="+", metavar="JOB_ID", help="job ids (UUIDs)")


def run(args: argparse.Namespace) -> int:
    try:
        job_ids = check_job_ids(args.job_ids)  # before anything else: nothing changes on a typo
    except BadJobId as exc:
        print(f"receiver: watch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    settings = store_settings_from(args, "watch", "POST /admin/watch")
    quiet_logs()
    records: list[WatchRecord] = run_async(_watch(settings, job_ids))
    for record in records:
        print(f"{record.job_id}  {NOTES.get(record.state, record.state)}")
    return 0


async def _watch(settings: Settings, job_ids: list[str]) -> list[WatchRecord]:
    from receiver.store import open_store

    store = open_store(settings.store)
    await store.open()
    try:
        return await watch_jobs(store, settings, job_ids, now=time.time())
    finally:
        await store.close()
