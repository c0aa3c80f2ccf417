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
    check_config,
    events,
    healthcheck,
    migrate,
    replay,
    serve,
    sign,
    simulate,
    webhooks,
)
from receiver.cli.common import EXIT_FAILED, EXIT_USAGE, Parser
from receiver.errors import ConfigError, ReceiverError


class Command(Protocol):
    """A command's module: it adds its own subparser and runs its own body."""

    def add_parser(self, commands: Any) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


#: Each command and the module that owns it, in the order ``receiver --help`` lists them.
COMMANDS: dict[str, Command] = {
    "serve": serve,
    "check-config": check_config,
    "healthcheck": healthcheck,
    "sign": sign,
    "replay": replay,
    "events": events,
    "migrate": migrate,
    # local testing and the upstream subscription
    "simulate": simulate,
    "webhooks": webhooks,
}


def build_parser() -> argparse.ArgumentParser:
    """The ``receiver`` parser with every command's subparser."""
    parser = Parser(prog="receiver", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"receiver {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
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
    except ReceiverError as exc:
        print(f"receiver: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        print(f"receiver: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
