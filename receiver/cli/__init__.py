"""The ``receiver`` command line.

Every mistake a user can make (missing file, bad TOML, unknown key, unreachable store or URL)
ends in one clear line on stderr and a non-zero exit, never a traceback: 2 for a bad config or
command line, 1 for anything that failed while running.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, Protocol

from receiver import __version__
from receiver.cli import (
    backup,
    check_config,
    events,
    healthcheck,
    init,
    lanes,
    migrate,
    reconcile,
    redeliver,
    replay,
    serve,
    sign,
    simulate,
    store_copy,
    upstream,
    watch,
    webhooks,
)
from receiver.cli.common import EXIT_FAILED, EXIT_USAGE, Parser, quiet_closed_pipe
from receiver.errors import ConfigError, ReceiverError, StoreNewer
from receiver.store.schema_version import SCHEMA_VERSION


class Command(Protocol):
    """A command's module: it adds its own subparser and runs its own body."""

    def add_parser(self, commands: Any) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


#: Each command and the module that owns it, in the order ``receiver --help`` lists them.
COMMANDS: dict[str, Command] = {
    "init": init,
    "serve": serve,
    "check-config": check_config,
    "healthcheck": healthcheck,
    "sign": sign,
    "replay": replay,
    "events": events,
    "migrate": migrate,
    "backup": backup.BACKUP,
    "restore": backup.RESTORE,
    "store": store_copy,
    # an incident: redelivery batches, lanes paused and resumed
    "redeliver": redeliver,
    "lanes": lanes,
    # pull mode: jobs that send no webhook, collections that missed some
    "watch": watch,
    "reconcile": reconcile,
    # local testing and the upstream subscription
    "simulate": simulate,
    "webhooks": webhooks,
    "upstream": upstream,
}


def build_parser() -> argparse.ArgumentParser:
    """The ``receiver`` parser with every command's subparser."""
    parser = Parser(
        prog="receiver",
        description="Receive the Mascot and Asset Generation Service's webhooks, store each one "
        "durably, fetch the job and its assets, and deliver them to the configured sinks.",
        epilog="New here? `receiver init` writes a config, `receiver serve` runs it, and "
        "`receiver simulate --config config.toml --events 20 --until-done` sends it events. "
        "`receiver COMMAND --help` explains each command.",
    )
    # `receiver X.Y.Z (schema N)`: the release and the inbox schema version it writes.
    parser.add_argument(
        "--version", action="version", version=f"receiver {__version__} (schema {SCHEMA_VERSION})"
    )
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=Parser, metavar="COMMAND"
    )
    for module in COMMANDS.values():
        module.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``receiver`` command; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"receiver: config: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except StoreNewer as exc:  # this release must not touch the inbox: as a bad config would
        print(f"receiver: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except ReceiverError as exc:
        print(f"receiver: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:  # the reader of stdout went away (`receiver events list | head`)
        return quiet_closed_pipe()
    except OSError as exc:
        print(f"receiver: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
