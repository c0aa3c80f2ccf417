"""``receiver redeliver``: send deliveries again as a tracked batch, and follow or cancel it.

``receiver redeliver [filters] [--dry-run]`` stores a batch in the inbox (or, with
``--dry-run``, only counts and shows a few); the running receiver, any replica, queues it step by
step through each sink's lane at its own pace. On a terminal the command then follows its
progress with a bar (Ctrl-C stops following, not the batch). ``redeliver status [ID]`` reads
batches; ``redeliver cancel ID`` stops one and withdraws what no lane has started to send. A
mistake in a filter, or an unknown batch, is one stderr line and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from receiver.cli.common import (
    EXIT_USAGE,
    Usage,
    cli_user,
    quiet_logs,
    run_async,
    store_settings_from,
    with_config,
)
from receiver.config.settings import Settings
from receiver.delivery import redelivery
from receiver.delivery.redelivery import filter_text
from receiver.humantime import ago, iso_utc
from receiver.store import open_existing_store
from receiver.store.base import Store
from receiver.store.batches import REDELIVERY_STATUSES, BadFilter, RedeliveryBatch, UnknownBatch

#: The option each filter field comes from, to name it in an error.
OPTIONS = {"sinks": "--sink", "job_id": "--job", "event": "--event", "status": "--status"}
FOLLOW_SECONDS = 0.5
BAR_WIDTH = 30


def add_parser(commands: Any) -> None:
    p = with_config(
        commands.add_parser(
            "redeliver",
            help="send deliveries again as a tracked batch (status, cancel)",
            description="Store a redelivery batch: the running receiver sends the matching "
            "deliveries again through each sink's lane at its own pace. WHEN is an ISO 8601 time "
            "(UTC unless it names an offset) or a duration back from now (90s, 10m, 2h, 3d).",
        )
    )
    p.add_argument(
        "--status",
        choices=REDELIVERY_STATUSES,
        default="dead",
        help="the deliveries' state (failed: pending after a failed attempt); default dead",
    )
    p.add_argument("--sink", action="append", metavar="NAME", help="only this sink (repeatable)")
    p.add_argument("--event", metavar="NAME", help="only this event, e.g. job.completed")
    p.add_argument("--job", metavar="ID", help="only this job's events")
    p.add_argument("--since", metavar="WHEN", help="received at or after WHEN")
    p.add_argument("--until", metavar="WHEN", help="received before WHEN")
    p.add_argument("--dry-run", action="store_true", help="count and show a few; change nothing")
    p.add_argument("--detach", action="store_true", help="do not follow the batch's progress")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    status = with_config(sub.add_parser("status", help="a batch's progress, or every batch"))
    status.add_argument("id", nargs="?", help="the batch id")
    status.add_argument("--json", action="store_true", help="as JSON")
    cancel = with_config(
        sub.add_parser("cancel", help="stop a batch: withdraw what no lane has started to send")
    )
    cancel.add_argument("id", help="the batch id")


def run(args: argparse.Namespace) -> int:
    settings = store_settings_from(args, "redeliver", "POST /admin/redeliveries")
    quiet_logs()
    try:
        code: int = run_async(_run(settings, args))
    except Usage as exc:
        print(f"receiver: redeliver: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\nstopped following; the batch goes on (receiver redeliver status)")
        return 0
    return code


async def _run(settings: Settings, args: argparse.Namespace) -> int:
    now = time.time()
    flt = None
    if args.action is None:  # the filter first: a typo changes nothing, whatever the inbox
        try:
            flt = redelivery.read_filter(_filter_data(args), sinks=_sinks(settings), now=now)
        except BadFilter as exc:
            raise Usage(f"{OPTIONS.get(exc.field, '--' + exc.field)}: {exc.message}") from None
    store = open_existing_store(settings.store, source=settings.source)
    await store.open()
    try:
        if args.action == "status":
            return await _status(store, args)
        if args.action == "cancel":
            try:
                batch = await store.cancel_redelivery(args.id, now=now)
            except UnknownBatch:
                raise Usage(f"no redelivery batch {args.id!r}") from None
            print(cancelled(batch))
            return 0
        assert flt is not None
        if args.dry_run:
            preview = await store.preview_redelivery(flt, now=now, sample=10)
            print(
                f"{preview.matched} deliveries match {filter_text(flt)} (dry run: nothing changed)"
            )
            for m in preview.sample:
                d = m.delivery
                received = f"{iso_utc(m.received_at)} ({ago(m.received_at, now)})"
                print(
                    f"  {d.event_id}  {d.sink}  {d.state}({d.attempts})  {m.event}  {received}"
                    f"  {d.last_error or ''}".rstrip()
                )
            return 0
        batch = await redelivery.start(store, flt, created_by=cli_user(), now=now)
        print(
            f"batch {batch.id}: {batch.matched} deliveries matched; the running receiver sends "
            f"them through each lane (receiver redeliver status {batch.id})"
        )
        if sys.stdout.isatty() and not args.detach:
            await follow(store, batch.id)
        return 0
    finally:
        await store.close()


def _sinks(settings: Settings) -> list[str]:
    return [s.name for s in settings.sinks]


def _filter_data(args: argparse.Namespace) -> dict[str, Any]:
    data = {
        "status": args.status,
        "sinks": args.sink or [],
        "event": args.event,
        "job_id": args.job,
        "since": args.since,
        "until": args.until,
    }
    return {k: v for k, v in data.items() if v not in (None, [])}


async def _status(store: Store, args: argparse.Namespace) -> int:
    if args.id:
        batch = await store.redelivery(args.id)
        if batch is None:
            raise Usage(f"no redelivery batch {args.id!r}")
        if args.json:
            print(json.dumps(batch.as_json(), indent=2))
        else:
            print(describe(batch))
        return 0
    batches = await store.redeliveries(limit=50)
    if args.json:
        print(json.dumps([b.as_json() for b in batches], indent=2))
    elif not batches:
        print("no redelivery batches")
    for batch in [] if args.json else batches:
        p = batch.progress
        print(
            f"{batch.id}  {batch.state:<9}  {iso_utc(batch.created_at)}  matched {batch.matched}"
            f"  queued {batch.queued}  delivered {p.delivered}  failed {p.failed}"
            f"  {filter_text(batch.filter)}"
        )
    return 0


def cancelled(batch: RedeliveryBatch) -> str:
    """What a cancel did: ``batch ID: cancelled; 123 deliveries withdrawn, 4 in flight may
    still complete``, or that the batch had finished already."""
    if batch.state != "cancelled":
        return f"batch {batch.id}: {batch.state} already; queued {batch.queued} of {batch.matched}"
    withdrawn = f"{batch.withdrawn} deliver{'y' if batch.withdrawn == 1 else 'ies'} withdrawn"
    pending = batch.progress.pending
    if batch.finished_at is not None or not pending:
        return f"batch {batch.id}: cancelled; {withdrawn}, none in flight"
    return f"batch {batch.id}: cancelled; {withdrawn}, {pending} in flight may still complete"


def describe(batch: RedeliveryBatch) -> str:
    """A batch's progress in a few lines."""
    p = batch.progress
    lines = [
        f"batch {batch.id}: {batch.state}",
        f"  matched {batch.matched}  queued {batch.queued}  delivered {p.delivered}"
        f"  failed {p.failed}  pending {p.pending}"
        + (f"  skipped {p.skipped}" if p.skipped else ""),
        f"  filter {filter_text(batch.filter)}",
        f"  started {iso_utc(batch.created_at)} by {batch.created_by}",
    ]
    if batch.cancelled_at:
        lines.append(
            f"  cancelled {iso_utc(batch.cancelled_at)}; {batch.withdrawn} withdrawn"
            " (put back as they were before the batch)"
        )
    if batch.finished_at:
        lines.append(f"  finished {iso_utc(batch.finished_at)}")
    return "\n".join(lines)


def bar(batch: RedeliveryBatch) -> str:
    """``[#########.....]  60%  delivered 600  failed 2  queued 1000 of 1000  running``."""
    p = batch.progress
    total = max(batch.matched, 1)
    finished = p.delivered + p.failed + p.skipped
    filled = min(BAR_WIDTH, BAR_WIDTH * finished // total)
    return (
        f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {100 * finished // total:3d}%"
        f"  delivered {p.delivered}  failed {p.failed}  queued {batch.queued} of {batch.matched}"
        f"  {batch.state}"
    )


async def follow(store: Store, batch_id: str) -> None:
    """Redraw the batch's bar until it is finished (on a terminal)."""
    while True:
        batch = await store.redelivery(batch_id)
        if batch is None:
            return
        sys.stdout.write("\r" + bar(batch) + "  ")
        sys.stdout.flush()
        if batch.finished_at is not None:
            sys.stdout.write("\n")
            return
        await asyncio.sleep(FOLLOW_SECONDS)
