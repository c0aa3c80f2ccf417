"""What every ``receiver`` command shares: exit codes, the parser class, settings, the runner.

The parser's errors are one line naming the closest valid command, choice or option; a closed
stdout (``receiver events list | head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

from receiver.config.load import load_settings
from receiver.config.schema import suggest
from receiver.config.settings import Settings, config_path
from receiver.errors import ReceiverError

EXIT_FAILED = 1
EXIT_USAGE = 2
# What a shell reports for a process ended by SIGPIPE (128 + 13), as `cat file | head` gives.
EXIT_CLOSED_PIPE = 141


class CommandError(ReceiverError):
    """The command failed."""


class Usage(Exception):
    """A mistake on the command line: one stderr line, exit 2."""


_INVALID_CHOICE = re.compile(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)")
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, naming the closest valid choice."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {self.explain(message)} (see {self.prog} --help)\n")

    def explain(self, message: str) -> str:
        """argparse's message, reworded for a mistyped command, choice or option."""
        choice = _INVALID_CHOICE.match(message)
        if choice:
            dest, given, listed = choice.groups()
            choices = re.findall(r"'([^']*)'", listed)
            close = suggest(given, choices)
            if dest.startswith("-"):
                text = f"{dest}: invalid choice {given!r}"
            else:
                text = f"unknown command {given!r}"
            if close:
                return f"{text}; did you mean {close}?"
            return f"{text}; one of: {', '.join(choices)}"
        unknown = _UNRECOGNIZED.match(message)
        if unknown:
            first = unknown.group(1).split()[0]
            if first.startswith("--"):
                close = suggest(first.split("=", 1)[0], sorted(self.every_option()))
                if close:
                    return f"unknown option {first}; did you mean {close}?"
        return message

    def every_option(self) -> set[str]:
        """The long options of this parser and of every subcommand below it."""
        found: set[str] = set()
        for action in self._actions:
            found.update(o for o in action.option_strings if o.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                for parser in action.choices.values():
                    if isinstance(parser, Parser):
                        found.update(parser.every_option())
        return found


def quiet_closed_pipe() -> int:
    """After a BrokenPipeError on stdout: no traceback, no error at exit; the exit status."""
    # Python flushes stdout again at exit, which would fail again: point it at /dev/null.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_CLOSED_PIPE


def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--config`` to a command's parser."""
    p.add_argument(
        "--config",
        help="config file (default: $RECEIVER_CONFIG, then ./config.toml)",
    )
    return p


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings of the ``--config`` file (or its defaults)."""
    return load_settings(config_path(args.config))


def store_settings_from(args: argparse.Namespace, command: str, instead: str) -> Settings:
    """:func:`settings_from`, for a command that works on the inbox directly: a ``memory://``
    inbox lives inside the running receiver, so the command says to use ``instead``."""
    settings = settings_from(args)
    if settings.store.url.startswith("memory://"):
        raise CommandError(
            f"{command}: a memory:// inbox lives inside the running receiver; use {instead}"
        )
    return settings


def read_payload(path: str | Path) -> bytes:
    """A payload file's bytes; a missing or unreadable file is a :class:`CommandError`."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise CommandError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CommandError(f"{path}: is a directory") from None
    except OSError as exc:
        raise CommandError(f"{path}: cannot be read ({exc.strerror})") from None


def cli_user() -> str:
    """Who runs this command, as a redelivery batch or a pause records it: ``user@host (cli)``."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()} (cli)"


def quiet_logs() -> None:
    """Silence the logs: for commands whose output is the outcome itself."""
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))


def run_async(coro: Any) -> Any:
    """Run a coroutine on uvloop when installed (``receiver[uvloop]``), else asyncio's loop."""
    runner: Any = asyncio.run
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        pass
    else:
        runner = uvloop.run
    # Outside the except block, so errors raised while running are not chained to ImportError.
    return runner(coro)
