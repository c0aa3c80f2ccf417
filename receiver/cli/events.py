"""``receiver events``: list and show the inbox's events, and redeliver them."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from receiver.cli.common import CommandError, Parser, run_async, settings_from, with_config
from receiver.config import Settings
from receiver.errors import UnknownEvent


def add_parser(commands: Any) -> None:
    events = commands.add_parser("events", help="inspect the inbox and redeliver events")
    event_commands = events.add_subparsers(
        dest="events_command", required=True, parser_class=Parser
    )
    listing = with_config(event_commands.add_parser("list", help="list events, newest first"))
    listing.add_argument("--status", choices=("pending", "done", "dead"))
    listing.add_argument("--limit", type=int, default=50)
    show = with_config(event_commands.add_parser("show", help="one event with its deliveries"))
    show.add_argument("id")
    redeliver = with_config(
        event_commands.add_parser("redeliver", help="process an event (or every dead one) again")
    )
    redeliver.add_argument("id", nargs="?")
    redeliver.add_argument("--dead", action="store_true", help="every dead delivery")


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    code: int = run_async(_events(settings, args))
    return code


async def _events(settings: Settings, args: argparse.Namespace) -> int:
    from receiver.store import open_store

    store = open_store(settings.store)
    await store.open()
    try:
        now = time.time()
        if args.events_command == "list":
            for event in await store.list(state=args.status, limit=args.limit):
                counts: dict[str, int] = {}
                for d in event.deliveries:
                    counts[d.state] = counts.get(d.state, 0) + 1
                summary = " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "no sinks"
                received = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(event.received_at))
                print(f"{event.id}  {event.event:<14} {event.state:<8} {received}  {summary}")
        elif args.events_command == "show":
            record = await store.get(args.id)
            if record is None:
                raise UnknownEvent(f"no event {args.id} in the inbox")
            print(json.dumps(record.as_json(), indent=2))
        elif args.dead:
            if args.id:
                raise CommandError("give an event id or --dead, not both")
            print(f"{await store.redeliver_dead(now=now)} dead deliveries made pending again")
        elif args.id:
            count = await store.redeliver(args.id, now=now)
            print(f"{count} deliveries of {args.id} made pending again")
        else:
            raise CommandError("events redeliver needs an event id or --dead")
    finally:
        await store.close()
    return 0
