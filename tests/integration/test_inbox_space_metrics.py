"""What the inbox takes, as a running ``receiver serve`` exports it on its ops listener.

On both stores ``receiver_inbox_file_bytes``; SQLite adds its free pages, Postgres how much of
the inbox is indexes and the server's ``shared_buffers`` beside it (the pair that
``ReceiverInboxOutgrowsDatabaseCache`` compares).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.helpers import ReceiverProcess, free_port, wait_for, write_config
from tests.support.postgres import (
    POSTGRES_URL,
    fresh_schema,
    require_postgres,
    shared_buffers_bytes,
)

SECRET = "whsec_space_" + "5d" * 12


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, str]]:
    if request.param == "sqlite":
        yield {"url": "sqlite:///inbox.db"}
        return
    require_postgres()
    async with fresh_schema() as schema:
        yield {"url": POSTGRES_URL, "schema": schema}


async def scraped(port: int) -> dict[str, float]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        text = await response.text()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("receiver_inbox_") and not sample.labels
    }


async def test_serve_exports_what_the_inbox_takes(tmp_path: Path, store: dict[str, str]) -> None:
    config = write_config(
        tmp_path / "config.toml",
        {
            "server": {"host": "127.0.0.1", "port": free_port()},
            "admin": {"port": free_port()},
            "webhook": {"secrets": [SECRET]},
            "store": store,
        },
    )
    receiver = ReceiverProcess(config, role="intake")
    receiver.start()
    seen: dict[str, float] = {}
    try:
        await receiver.wait_ready()

        async def measured() -> bool:
            seen.update(await scraped(receiver.ops_port))
            return seen.get("receiver_inbox_file_bytes", 0) > 0

        await wait_for(measured, 20, 0.2, "the inbox's size on /metrics")
    finally:
        receiver.stop()
    if "schema" not in store:
        assert seen["receiver_inbox_free_bytes"] >= 0
        assert seen["receiver_inbox_index_bytes"] == seen["receiver_inbox_cache_bytes"] == 0
        return
    assert 0 < seen["receiver_inbox_index_bytes"] < seen["receiver_inbox_file_bytes"]
    assert seen["receiver_inbox_cache_bytes"] == await shared_buffers_bytes()
