"""What every ``receiver`` command shares: exit codes, the parser class, settings, the runner."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any, NoReturn

from receiver.config import Settings, config_path, load_settings
from receiver.errors import ReceiverError

EXIT_FAILED = 1
EXIT_USAGE = 2


class CommandError(ReceiverError):
    """The command failed."""


class Parser(argparse.ArgumentParser):
    """A parser whose usage errors are one line on stderr and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"receiver: {message} (see receiver --help)\n")


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


def quiet_logs() -> None:
    """Silence the logs: for commands whose output is the outcome itself."""
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))


def run_async(coro: Any) -> Any:
    """Run a coroutine on uvloop when installed (``receiver[uvloop]``), else asyncio's loop."""
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        uvloop = None
    # Outside the except block, so errors raised while running are not chained to ImportError.
    return asyncio.run(coro) if uvloop is None else uvloop.run(coro)
