"""A real ``receiver serve --role intake`` process for the hostile-input tests: its config."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

from tests.support.helpers import ReceiverProcess, free_port, write_config

SECRET = "whsec_hostile_" + "7d" * 12
READ_TIMEOUT = 1.0


def intake_config(directory: Path, **server: object) -> Path:
    return write_config(
        directory / "config.toml",
        {
            "server": {
                "host": "127.0.0.1",
                "port": free_port(),
                "read_timeout_seconds": READ_TIMEOUT,
                "max_body_bytes": 65536,
                **server,
            },
            "admin": {"port": free_port()},
            "webhook": {"secrets": [SECRET]},
            "store": {"url": "sqlite:///inbox.db"},
            "log": {"format": "json", "level": "info"},
            "sinks": [{"name": "files", "type": "download", "directory": "downloads"}],
        },
    )


@contextlib.contextmanager
def running(proc: ReceiverProcess) -> Iterator[ReceiverProcess]:
    """The process started and ready, stopped on exit (for module-scoped fixtures)."""
    proc.start()
    try:
        asyncio.run(proc.wait_ready())
        yield proc
    finally:
        proc.stop()
