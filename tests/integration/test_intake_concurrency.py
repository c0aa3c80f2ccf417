"""Dedup under concurrency, end to end: the same event sent 50 times at once through a real
listener is stored once, every copy gets a 2xx, and exactly one is told it was new. On both SQL
inboxes, where concurrent webhooks share one group commit."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.config.settings import Settings
from receiver.signature import webhook_headers
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres

SECRET = "whsec_concurrency_test"
COPIES = 50


def settings(tmp_path: Path, store: dict[str, Any]) -> Settings:
    return parse_settings(
        {
            "webhook": {"secrets": [SECRET]},
            "store": store,
            "sinks": [{"name": "files", "type": "download", "directory": str(tmp_path / "dl")}],
        },
        env={},
    )


@pytest.fixture(params=["sqlite", "postgres"])
async def store_config(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[dict]:
    if request.param == "sqlite":
        yield {"url": f"sqlite:///{tmp_path}/inbox.db"}
        return
    require_postgres()
    async with fresh_schema() as schema:
        yield {"url": POSTGRES_URL, "schema": schema, "pool_size": 4}


def webhook(event_id: str) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(
        {"id": event_id, "object": "event", "event": "job.completed", "job_id": "job-1"}
    ).encode()
    headers = webhook_headers(
        SECRET, body, int(time.time()), event_id=event_id, event_name="job.completed"
    )
    return body, headers


async def test_the_same_event_fifty_times_at_once(
    aiohttp_client: Any, tmp_path: Path, store_config: dict
) -> None:
    runtime = Runtime(settings(tmp_path, store_config), role="intake")
    async with runtime:
        client = await aiohttp_client(runtime.public_app())
        body, headers = webhook("evt-same")
        other_body, other_headers = webhook("evt-other")

        async def send(body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
            response = await client.post("/webhooks", data=body, headers=headers)
            return response.status, await response.json()

        # Another event in the middle: the copies share group commits with it.
        sends = [send(body, headers) for _ in range(COPIES)]
        sends.insert(COPIES // 2, send(other_body, other_headers))
        answers = await asyncio.gather(*sends)
        other = answers.pop(COPIES // 2)

        assert other == (200, {"received": True, "id": "evt-other", "duplicate": False})
        assert [status for status, _ in answers] == [200] * COPIES
        assert [a["duplicate"] for _, a in answers].count(False) == 1
        assert {a["id"] for _, a in answers} == {"evt-same"}
        stored = await runtime.store.list(limit=100)
        assert sorted(r.id for r in stored) == ["evt-other", "evt-same"]
        assert all([d.sink for d in r.deliveries] == ["files"] for r in stored)
