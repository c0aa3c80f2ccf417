"""``receiver serve``: run the listeners and the workers."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from receiver.cli.common import run_async, settings_from, with_config
from receiver.errors import ConfigError
from receiver.intake.processes import MAX_PROCESSES
from receiver.logs import configure_logging


def add_parser(commands: Any) -> None:
    serve = with_config(commands.add_parser("serve", help="run the listeners and the workers"))
    serve.add_argument(
        "--role",
        choices=("all", "intake", "worker"),
        default="all",
        help="intake: only the listeners (events are stored, not processed); worker: only the "
        "ops listener and the workers; default all",
    )
    serve.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="intake processes sharing the public port (default: server.processes)",
    )
    # Set by the first process in the ones it starts (see receiver.intake.processes).
    serve.add_argument("--process-index", type=int, default=0, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    if args.processes is not None:
        if not 1 <= args.processes <= MAX_PROCESSES:
            raise ConfigError(f"--processes: must be between 1 and {MAX_PROCESSES}")
        server = dataclasses.replace(settings.server, processes=args.processes)
        settings = dataclasses.replace(settings, server=server)
    if args.processes is not None and args.processes > 1 and args.role == "worker":
        # (server.processes in a config shared by intake and worker processes is fine: a
        # worker process ignores it.)
        raise ConfigError("--processes: runs more intake processes; --role worker has no intake")
    configure_logging(settings.log.level, settings.log.format)
    from receiver.server import serve

    run_async(serve(settings, role=args.role, process_index=args.process_index))
    return 0
