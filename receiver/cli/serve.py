"""``receiver serve``: run the listeners and the workers."""

from __future__ import annotations

import argparse
from typing import Any

from receiver.cli.common import run_async, settings_from, with_config
from receiver.logs import configure_logging


def add_parser(commands: Any) -> None:
    serve = with_config(commands.add_parser("serve", help="run the listeners and the workers"))
    serve.add_argument("--role", choices=("all", "intake", "worker"), default="all")


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    configure_logging(settings.log.level, settings.log.format)
    from receiver.app import serve

    run_async(serve(settings, role=args.role))
    return 0
