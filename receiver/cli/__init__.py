"""The ``receiver`` command line.

Every mistake a user can make (missing file, bad TOML, unknown key, unreachable store or URL)
ends in one clear line on stderr and a non-zero exit, never a traceback: 2 for a bad config or
command line, 1 for anything that failed while running.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any, Protocol

from receiver import __version__
from receiver.cli.common import EXIT_FAILED, EXIT_USAGE, Parser, quiet_closed_pipe
from receiver.errors import ConfigError, ReceiverError, StoreNewer
from receiver.store.schema_version import SCHEMA_VERSION


class Command(Protocol):
    """A command's module: it adds its own subparser and runs its own body."""

    def add_parser(self, commands: Any) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


#: Each command and the module that owns it (``module:attribute`` where one module owns two), in
#: the order ``receiver --help`` lists them. A module is imported only for its own command, so
#: ``receiver events list`` starts without loading the web server, the simulator or the sinks.
COMMANDS: dict[str, str] = {
    "init": "receiver.cli.init",
    "serve": "receiver.cli.serve",
    "check-config": "receiver.cli.check_config",
    "healthcheck": "receiver.cli.healthcheck",
    "sign": "receiver.cli.sign",
    "replay": "receiver.cli.replay",
    "events": "receiver.cli.events",
    "migrate": "receiver.cli.migrate",
    "backup": "receiver.cli.backup:BACKUP",
    "restore": "receiver.cli.backup:RESTORE",
    "store": "receiver.cli.store_copy",
    # an incident: redelivery batches, lanes paused and resumed
    "redeliver": "receiver.cli.redeliver",
    "lanes": "receiver.cli.lanes",
    # pull mode: jobs that send no webhook, collections that missed some
    "watch": "receiver.cli.watch",
    "reconcile": "receiver.cli.reconcile",
    # local testing and the upstream subscription
    "simulate": "receiver.cli.simulate",
    "webhooks": "receiver.cli.webhooks",
    "upstream": "receiver.cli.upstream",
}


def command(name: str) -> Command:
    """The module (or object) that owns command ``name``, imported now."""
    module, _, attribute = COMMANDS[name].partition(":")
    owner = importlib.import_module(module)
    found: Command = getattr(owner, attribute) if attribute else owner
    return found


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``receiver`` parser with every command's subparser, or with command ``only``'s alone
    (enough to parse a command line that starts with it)."""
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
    for name in COMMANDS if only is None else (only,):
        command(name).add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``receiver`` command; returns the exit code."""
    words = sys.argv[1:] if argv is None else list(argv)
    # A line that starts with a command needs that command's parser alone; anything else
    # (--help, --version, a mistyped command) gets them all, to list or to suggest from.
    only = words[0] if words and words[0] in COMMANDS else None
    args = build_parser(only).parse_args(words)
    try:
        return command(args.command).run(args)
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
