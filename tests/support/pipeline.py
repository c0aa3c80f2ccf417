"""A receiver in one process for tests: fast settings, signed sends, waiting for an outcome."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from receiver.config.load import parse_settings
from receiver.config.settings import Settings
from receiver.signature import webhook_headers
from receiver.simulator import Simulator
from tests.support.helpers import wait_for

#: Worker timings that keep retries and polling in the tens of milliseconds.
FAST_WORKER: dict[str, Any] = {
    "backoff_initial_seconds": 0.05,
    "backoff_max_seconds": 0.2,
    "poll_interval_seconds": 0.05,
}


def download_sink(directory: str | Path, name: str = "files") -> dict[str, Any]:
    """A download sink allowed to fetch from the loopback test servers."""
    return {
        "name": name,
        "type": "download",
        "directory": str(directory),
        "allow_private_networks": True,
    }


def fast_settings(
    upstream: Simulator,
    *,
    secret: str,
    api_key: str,
    store: Mapping[str, Any],
    sinks: Sequence[Mapping[str, Any]],
    worker: Mapping[str, Any] | None = None,
) -> Settings:
    """Settings for a receiver fed by ``upstream``, with :data:`FAST_WORKER` timings."""
    return parse_settings(
        {
            "webhook": {"secrets": [secret]},
            "api": {"base_url": upstream.base_url, "api_key": api_key, "timeout_seconds": 5},
            "store": dict(store),
            "worker": {**FAST_WORKER, **(worker or {})},
            "sinks": [dict(sink) for sink in sinks],
        },
        env={},
    )


def download_settings(
    upstream: Simulator,
    tmp_path: Path,
    *,
    secret: str,
    api_key: str,
    worker: Mapping[str, Any] | None = None,
) -> Settings:
    """:func:`fast_settings` with a SQLite inbox in ``tmp_path`` and one download sink to
    ``tmp_path / "dl"``."""
    return fast_settings(
        upstream,
        secret=secret,
        api_key=api_key,
        store={"url": f"sqlite:///{tmp_path}/inbox.db"},
        sinks=[download_sink(tmp_path / "dl")],
        worker=worker,
    )


def signed(payload: Mapping[str, Any], secret: str) -> tuple[bytes, dict[str, str]]:
    """The body and the upstream's headers for ``payload``, signed now."""
    body = json.dumps(payload).encode()
    headers = webhook_headers(
        secret, body, int(time.time()), event_id=payload["id"], event_name=payload["event"]
    )
    return body, headers


async def send(client: Any, payload: Mapping[str, Any], secret: str) -> None:
    """POST ``payload`` signed with ``secret`` to ``/webhooks``; it must be accepted."""
    body, headers = signed(payload, secret)
    response = await client.post("/webhooks", data=body, headers=headers)
    assert response.status == 200, await response.text()


async def settled(runtime: Any, event_id: str, state: str = "done", timeout: float = 15.0) -> Any:
    """Wait until the event reaches ``state`` in the runtime's store; returns its record."""

    async def check() -> bool:
        record = await runtime.store.get(event_id)
        return record is not None and record.state == state

    await wait_for(check, timeout, what=f"event {event_id} {state}")
    return await runtime.store.get(event_id)
