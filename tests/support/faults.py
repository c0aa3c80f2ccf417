"""What the crash and fault tests share: receiver configs, signed senders, file and row checks."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import aiohttp

from receiver.simulator import Simulator
from tests.support.helpers import free_port, write_config
from tests.support.peers import Capture
from tests.support.pipeline import signed

SECRET = "whsec_faults_" + "5e" * 12
API_KEY = "service_" + "fa" * 32


class SlowPeers:
    """Sinks beside the download one: a consumer that answers at once (fast), a chat server
    behind a paced lane, and an endpoint that never answers (its attempts end at a timeout)."""

    def __init__(self, consumer: Capture, chat: Capture, hang: Capture) -> None:
        self.consumer, self.chat, self.hang = consumer, chat, hang

    def sinks(self) -> list[dict[str, Any]]:
        return [
            {"name": "consumer", "type": "http", "url": self.consumer.url, "secret": "c" * 24},
            {
                "name": "chat",
                "type": "slack",
                "format": "slack",
                "url": self.chat.url,
                "rate_limit_per_second": 2,
            },
            {
                "name": "stuck",
                "type": "http",
                "url": self.hang.url,
                "secret": "s" * 24,
                "timeout_seconds": 1,
                "max_attempts": 1000,
            },
        ]


def receiver_config(
    tmp_path: Path,
    upstream: Simulator,
    *,
    slow_peers: SlowPeers | None = None,
    lease: float = 5,
    drain: float = 2.0,
    server: dict[str, Any] | None = None,
    worker: dict[str, Any] | None = None,
    store: dict[str, Any] | None = None,
    log_level: str = "info",
) -> Path:
    """A config for a ``receiver serve`` subprocess with one download sink under tmp_path."""
    assert upstream.base_url is not None
    return write_config(
        tmp_path / "config.toml",
        {
            "server": {
                "host": "127.0.0.1",
                "port": free_port(),
                "shutdown_timeout_seconds": drain,
                **(server or {}),
            },
            "admin": {"port": free_port()},
            "webhook": {"secrets": [SECRET]},
            "api": {"base_url": upstream.base_url, "api_key": API_KEY, "timeout_seconds": 10},
            "store": {"url": "sqlite:///inbox.db", **(store or {})},
            "worker": {
                "lease_seconds": lease,
                "poll_interval_seconds": 0.1,
                "backoff_initial_seconds": 0.1,
                "backoff_max_seconds": 0.5,
                **(worker or {}),
            },
            "log": {"format": "json", "level": log_level},
            "sinks": [
                {
                    "name": "files",
                    "type": "download",
                    "directory": "downloads",
                    "allow_private_networks": True,
                },
                *(slow_peers.sinks() if slow_peers else []),
            ],
        },
    )


def signed_post(payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """The body and the upstream's headers for ``payload``, signed now."""
    return signed(payload, SECRET)


async def post_until_2xx(
    session: aiohttp.ClientSession,
    url: str,
    payload: dict[str, Any],
    *,
    pause: float = 0.05,
    deadline: float = 60.0,
) -> dict[str, Any]:
    """POST like the upstream does: again (re-signed) after any failure, until a 2xx.

    Returns the 2xx answer's JSON with ``attempts`` added.
    """
    give_up = time.monotonic() + deadline
    attempts = 0
    while time.monotonic() < give_up:
        attempts += 1
        body, headers = signed_post(payload)
        try:
            async with session.post(url, data=body, headers=headers) as response:
                text = await response.read()
                if 200 <= response.status < 300:
                    answer: dict[str, Any] = json.loads(text)
                    answer["attempts"] = attempts
                    return answer
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(pause)
    raise AssertionError(f"event {payload['id']} got no 2xx in {deadline} s ({attempts} tries)")


def client_session(total_timeout: float = 10.0) -> aiohttp.ClientSession:
    """A session without keep-alive: a killed server never leaves a stale pooled connection."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True),
        timeout=aiohttp.ClientTimeout(total=total_timeout),
    )


def db_rows(db: Path, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows from the receiver's inbox, read from outside (WAL: the receiver keeps writing)."""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as conn:
        return conn.execute(query, params).fetchall()


def final_files(directory: Path) -> set[str]:
    """Files under ``directory`` except the sink's temporary files (``.name.tmp-xxxx``)."""
    return {
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if p.is_file() and not is_temporary(p)
    }


def temporary_files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file() and is_temporary(p)]


def is_temporary(path: Path) -> bool:
    return path.name.startswith(".") and ".tmp-" in path.name
