"""The command line's parser and exits: one clear stderr line for a mistyped command or option,
with a suggestion, and a quiet exit when the reader of stdout goes away (``| head``)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import NoReturn

from receiver.config_schema import suggest

EXIT_USAGE = 2
# What a shell reports for a process ended by SIGPIPE (128 + 13), as `cat file | head` gives.
EXIT_CLOSED_PIPE = 141

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
