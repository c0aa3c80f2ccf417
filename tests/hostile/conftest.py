"""A real ``receiver serve --role intake`` process for the hostile-input tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ReceiverProcess, free_port, write_config

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


@pytest.fixture(scope="module")
def intake_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReceiverProcess]:
    """One intake process for a whole module."""
    config = intake_config(tmp_path_factory.mktemp("intake"))
    with running(ReceiverProcess(config, role="intake")) as proc:
        yield proc
