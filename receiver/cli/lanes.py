"""``receiver lanes``: each sink's lane (running, paused, circuit open; backlog, in flight, rate),
and ``lanes pause NAME [--for D] [--reason T]`` / ``lanes resume NAME``.

The pause is written to the inbox's lane row, so it holds across restarts and for every replica
sharing the store, whether or not a receiver runs now. An unknown lane or a bad duration is one
stderr line and exit 2.
"""

from __future__ import annotations

import argparse
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
from receiver.delivery import pauses
from receiver.humantime import iso_utc, parse_duration
from receiver.store import open_existing_store

COLUMNS = ("SINK", "TYPE", "STATE", "BACKLOG", "IN FLIGHT", "RATE/S", "PAUSED")


def add_parser(commands: Any) -> None:
    p = with_config(
        commands.add_parser(
            "lanes",
            help="each sink's lane; pause and resume one",
            description="Each lane's state (running, paused until, circuit open), backlog, in "
            "flight and rate, across every replica sharing the inbox.",
        )
    )
    p.add_argument("--json", action="store_true", help="as JSON")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    pause = with_config(sub.add_parser("pause", help="stop a lane sending (it keeps everything)"))
    pause.add_argument("name", help="the sink's name")
    pause.add_argument("--for", dest="duration", metavar="DURATION", help="e.g. 30m, 2h")
    pause.add_argument("--reason", metavar="TEXT", help="shown with the pause")
    resume = with_config(sub.add_parser("resume", help="let a paused lane send again"))
    resume.add_argument("name", help="the sink's name")


def run(args: argparse.Namespace) -> int:
    settings = store_settings_from(args, "lanes", "the admin API's /admin/lanes")
    quiet_logs()
    try:
        seconds = None
        if getattr(args, "duration", None):
            try:
                seconds = parse_duration(args.duration)
            except ValueError as exc:
                raise Usage(f"--for: {exc}") from None
        if args.action is not None:
            pauses.known_lane(settings, args.name)
            try:
                pauses.pause_terms(seconds, getattr(args, "reason", None))
            except pauses.BadPause as exc:
                raise Usage(f"--{str(exc).replace('seconds', 'for', 1)}") from None
        code: int = run_async(_run(settings, args, seconds))
    except pauses.UnknownLane as exc:
        print(f"receiver: lanes: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Usage as exc:
        print(f"receiver: lanes: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return code


async def _run(settings: Settings, args: argparse.Namespace, seconds: float | None) -> int:
    now = time.time()
    store = open_existing_store(settings.store, source=settings.source)
    await store.open()
    try:
        if args.action == "pause":
            held = await pauses.pause(
                store,
                settings,
                args.name,
                seconds=seconds,
                reason=args.reason,
                by=cli_user(),
                now=now,
            )
            until = f"until {iso_utc(held.until)}" if held.until else "until resumed"
            print(f"lane {args.name} paused {until}; it keeps everything and sends nothing")
            return 0
        if args.action == "resume":
            was = await pauses.resume(store, settings, args.name, by=cli_user(), now=now)
            note = "resumed" if was is not None else "was not paused"
            print(f"lane {args.name} {note}; it sends again at its own pace")
            return 0
        views = await pauses.lane_views(store, settings, now=now)
    finally:
        await store.close()
    if args.json:
        print(json.dumps([v.as_json() for v in views], indent=2))
        return 0
    rows = [COLUMNS]
    for v in views:
        paused = ""
        if v.paused:
            paused = f"until {iso_utc(v.paused_until)}" if v.paused_until else "until resumed"
            paused += f" ({v.reason})" if v.reason else ""
        elif v.held_until is not None:
            paused = f"held until {iso_utc(v.held_until)}"
        rate = f"{v.rate_limit_per_second:g}" if v.rate_limit_per_second else "-"
        rows.append((v.sink, v.type, v.state, str(v.backlog), str(v.in_flight), rate, paused))
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
    return 0
