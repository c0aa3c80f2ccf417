"""``receiver migrate``: create or upgrade the inbox schema, then exit."""

from __future__ import annotations

import argparse
from typing import Any

from receiver.cli.common import run_async, settings_from, with_config
from receiver.logs import configure_logging


def add_parser(commands: Any) -> None:
    with_config(
        commands.add_parser("migrate", help="create or upgrade the inbox schema, then exit")
    )


def run(args: argparse.Namespace) -> int:
    """Apply the inbox schema migrations (also when store.auto_migrate is false)."""
    settings = settings_from(args)
    configure_logging(settings.log.level, settings.log.format)
    from receiver.store.migrate import migrate_store

    print(run_async(migrate_store(settings.store)))
    return 0
