"""``receiver events``: list, follow, show and redeliver the events in the inbox.

Every subcommand reads the inbox the config names and never creates one: a SQLite file that is
not there is an error naming the path and ``--config`` (a relative ``sqlite:///`` path is
relative to the working directory, so running from another directory is the usual cause).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from receiver.cli.common import (
    CommandError,
    cli_user,
    quiet_logs,
    run_async,
    settings_from,
    with_config,
)
from receiver.config.settings import Settings
from receiver.errors import UnknownEvent
from receiver.humantime import ago, iso_utc, parse_since
from receiver.store import open_existing_store
from receiver.store.base import Store
from receiver.store.batches import RedeliveryFilter
from receiver.store.browse import Cursor, EventQuery
from receiver.store.records import EventRecord

STATES = ("pending", "done", "dead")
TAIL_INTERVAL_SECONDS = 1.0


def add_parser(commands: Any) -> None:
    """``events list|tail|show|redeliver`` on the ``receiver`` parser's subcommands."""
    events = commands.add_parser(
        "events",
        help="list, follow, show and redeliver the events in the inbox",
        description="Read the inbox of --config (never creating one).",
    )
    sub = events.add_subparsers(dest="events_command", required=True, metavar="COMMAND")

    listing = with_config(
        sub.add_parser(
            "list",
            help="events, newest first, with each sink's delivery state",
            description="Events, newest first: id, event, state, when received (UTC, and how "
            "long ago) and each sink's delivery. Filters combine.",
        )
    )
    _filters(listing)
    listing.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    listing.add_argument("--json", action="store_true", help="a JSON array of the events")

    tail = with_config(
        sub.add_parser(
            "tail",
            help="follow new events as they arrive (Ctrl-C to stop)",
            description="Print the newest --limit events, then each new one as it arrives.",
        )
    )
    _filters(tail, since=False)
    tail.add_argument("--limit", type=int, default=10, help="events shown first (default 10)")
    tail.add_argument("--json", action="store_true", help="one JSON object a line")
    tail.add_argument(
        "--interval",
        type=float,
        default=TAIL_INTERVAL_SECONDS,
        metavar="SECONDS",
        help=f"how often to look (default {TAIL_INTERVAL_SECONDS:g})",
    )

    show = with_config(sub.add_parser("show", help="one event with its payload and deliveries"))
    show.add_argument("id", help="the event id")

    redeliver = with_config(
        sub.add_parser(
            "redeliver",
            help="process an event again (every sink, or --sink), or every dead delivery",
            description="Make deliveries pending and due now; a running receiver sends them at "
            "its next poll.",
        )
    )
    redeliver.add_argument("id", nargs="?", help="the event id")
    redeliver.add_argument("--sink", metavar="NAME", help="only this sink's delivery")
    redeliver.add_argument("--dead", action="store_true", help="every dead delivery instead")


def _filters(parser: argparse.ArgumentParser, *, since: bool = True) -> None:
    parser.add_argument("--status", choices=STATES, help="only events in this state")
    parser.add_argument("--event", metavar="NAME", help="only this event, e.g. job.failed")
    parser.add_argument(
        "--sink",
        metavar="NAME",
        help="only events with a delivery to this sink (with --status: in that state)",
    )
    parser.add_argument("--job", metavar="ID", help="only this job's events (or this event id)")
    if since:
        parser.add_argument(
            "--since", metavar="WHEN", help="received since: 10m, 2h, 1d or a UTC time"
        )


def run(args: argparse.Namespace, *, now: Callable[[], float] = time.time) -> int:
    """Run one ``events`` subcommand; 0 on success."""
    if args.events_command == "redeliver":
        _check_redeliver_args(args)
    if getattr(args, "limit", 1) < 1:
        raise CommandError("--limit must be at least 1")
    query = _query(args, now()) if args.events_command in ("list", "tail") else None
    settings = settings_from(args)
    quiet_logs()  # the outcome is this command's output
    return _run_async(_run(settings, args, query, now))


def _run_async(coro: Any) -> int:
    try:
        result: int = run_async(coro)
    except KeyboardInterrupt:
        return 0  # Ctrl-C is how `events tail` ends
    return result


async def _run(
    settings: Settings, args: argparse.Namespace, query: EventQuery | None, now: Callable[[], float]
) -> int:
    store = open_existing_store(settings.store, source=settings.source)
    await store.open()
    try:
        command = args.events_command
        if command == "list":
            assert query is not None
            records = await store.browse(query, limit=args.limit)
            print_list(records, args, now(), settings)
        elif command == "tail":
            assert query is not None
            await tail(store, query, args, now)
        elif command == "show":
            record = await store.get(args.id)
            if record is None:
                raise UnknownEvent(f"no event {args.id} in the inbox")
            print(json.dumps(record.as_json(), indent=2))
        else:
            print(await redeliver(store, args, now()))
    finally:
        await store.close()
    return 0


def _check_redeliver_args(args: argparse.Namespace) -> None:
    if args.dead and (args.id or args.sink):
        raise CommandError("give an event id (and --sink) or --dead, not both")
    if not args.dead and not args.id:
        raise CommandError("events redeliver needs an event id or --dead")


def _query(args: argparse.Namespace, now: float) -> EventQuery:
    since = None
    if getattr(args, "since", None):
        try:
            since = parse_since(args.since, now)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
    return EventQuery(
        state=args.status, event=args.event, sink=args.sink, ref=args.job, since=since
    )


# --- list and tail ------------------------------------------------------------------------------

_COLUMNS = ("ID", "EVENT", "STATE", "RECEIVED", "DELIVERIES")


def print_list(
    records: list[EventRecord], args: argparse.Namespace, now: float, settings: Settings
) -> None:
    if args.json:
        print(json.dumps([as_json(r) for r in records], indent=2))
        return
    if not records:
        print(f"no events{_filter_text(args)} in the inbox ({_inbox_name(settings)})")
        return
    rows = [_COLUMNS] + [_row(r, now) for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
    if len(records) == args.limit:
        print(f"(the newest {args.limit}; --limit N for more)")


def _row(record: EventRecord, now: float) -> tuple[str, ...]:
    received = f"{iso_utc(record.received_at)} ({ago(record.received_at, now)})"
    return (record.id, record.event, record.state, received, deliveries_text(record))


def deliveries_text(record: EventRecord) -> str:
    """``files:done slack:dead(12)``: each sink's state, with attempts while not done."""
    if not record.deliveries:
        return "no sinks"
    parts = []
    for d in record.deliveries:
        tries = f"({d.attempts})" if d.state in ("pending", "dead") and d.attempts else ""
        parts.append(f"{d.sink}:{d.state}{tries}")
    return " ".join(parts)


def as_json(record: EventRecord) -> dict[str, Any]:
    """An event without its payload, with its receipt time also as UTC ISO."""
    out = record.as_json(with_body=False)
    out["received_at_utc"] = iso_utc(record.received_at)
    return out


def _filter_text(args: argparse.Namespace) -> str:
    given = [
        f"--{name} {getattr(args, name)}"
        for name in ("status", "event", "sink", "job", "since")
        if getattr(args, name, None)
    ]
    return f" matching {' '.join(given)}" if given else ""


def _inbox_name(settings: Settings) -> str:
    url = settings.store.url
    if url.startswith("sqlite://"):
        from receiver.store.sqlite import sqlite_path

        return str(sqlite_path(url).absolute())
    return url.split("://", 1)[0] + " store"


async def tail(
    store: Store, query: EventQuery, args: argparse.Namespace, now: Callable[[], float]
) -> None:
    """Print the newest ``args.limit`` events oldest first, then each new one, until cancelled."""
    records = list(reversed(await store.browse(query, limit=args.limit)))
    if not args.json:
        print("  ".join(_COLUMNS), flush=True)
    cursor: Cursor | None = None
    while True:
        for record in records:
            if args.json:
                print(json.dumps(as_json(record)), flush=True)
            else:
                print("  ".join(_row(record, now())), flush=True)
            cursor = Cursor(record.received_at, record.id)
        await asyncio.sleep(args.interval)
        if cursor is None:
            records = list(reversed(await store.browse(query, limit=args.limit)))
        else:  # the page just newer than the cursor comes newest first, like every page
            records = list(reversed(await store.browse(query, after=cursor, limit=1000)))


# --- redeliver ---------------------------------------------------------------------------------


async def redeliver(store: Store, args: argparse.Namespace, now: float) -> str:
    """A redelivery batch (receiver.delivery.redelivery): one event (every sink or ``--sink``), or
    every dead delivery; its first step is queued now, a running receiver queues the rest."""
    from receiver.delivery import redelivery  # only this subcommand needs it (and its metrics)

    by = cli_user()
    if args.dead:
        batch = await redelivery.start(
            store, RedeliveryFilter(status="dead"), created_by=by, now=now
        )
        rest = batch.matched - batch.queued
        more = f"; a running receiver queues the other {rest}" if batch.queuing and rest else ""
        return f"{batch.queued} dead deliveries made pending again (batch {batch.id}){more}"
    batch = await redelivery.redeliver_event(store, args.id, sink=args.sink, created_by=by, now=now)
    if args.sink is None:
        return f"{batch.queued} deliveries of {args.id} made pending again"
    if not batch.queued:
        return f"the {args.sink} delivery of {args.id} is skipped (its filter): nothing to redo"
    return f"the {args.sink} delivery of {args.id} made pending again"
