"""Every `--help` text reads as plain text: each command and option has help, no docstring
markup."""

from __future__ import annotations

import argparse
import re

from receiver.cli import build_parser

_MARKUP = re.compile(r"``|:(func|class|meth|mod|data):`")


def parsers(parser: argparse.ArgumentParser, path: str = "receiver"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, f"{path} {name}")


def test_every_command_and_option_has_help() -> None:
    missing = []
    for path, parser in parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{path} {a.dest}" for a in action._choices_actions if not a.help]
            elif not action.help and not isinstance(
                action, (argparse._HelpAction, argparse._VersionAction)
            ):
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def test_no_help_text_shows_docstring_markup() -> None:
    for path, parser in parsers(build_parser()):
        text = parser.format_help()
        assert not _MARKUP.search(text), f"{path} --help shows markup"
    assert len(list(parsers(build_parser()))) > 15
