"""The ingest benchmark's group-commit baselines keep what they answer for: a 200 only once the
event is stored, an id stored once however often it comes, a bad signature refused. A baseline
that dropped events would make the receiver look slower than it is."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web

from bench.common import SECRET, webhook_body
from bench.ingest import baselines
from receiver.signature import SIGNATURE_HEADER, sign
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres

Client = Any


async def post_all(client: Client, bodies: list[bytes]) -> list[int]:
    now = int(time.time())

    async def post(body: bytes) -> int:
        headers = {SIGNATURE_HEADER: sign(SECRET, body, now)}
        async with client.post("/webhooks", data=body, headers=headers) as response:
            return int(response.status)

    return list(await asyncio.gather(*(post(body) for body in bodies)))


async def check_baseline(client: Client, stored: Callable[[], Awaitable[list[str]]]) -> None:
    bodies = [webhook_body(f"t{n}") for n in range(40)]
    ids = sorted(json.loads(body)["id"] for body in bodies)
    assert await post_all(client, bodies + bodies[:10]) == [200] * 50
    assert sorted(await stored()) == ids
    forged = {SIGNATURE_HEADER: sign("whsec_other", bodies[0], int(time.time()))}
    async with client.post("/webhooks", data=webhook_body("forged"), headers=forged) as response:
        assert response.status == 401
    assert len(await stored()) == len(ids)


async def test_the_sqlite_group_commit_baseline_stores_each_event_once(
    aiohttp_client: Callable[[web.Application], Awaitable[Client]], tmp_path: Path
) -> None:
    path = tmp_path / "grouped.db"
    client = await aiohttp_client(await baselines.grouped_app(str(path), "full"))

    async def stored() -> list[str]:
        with sqlite3.connect(path) as conn:
            return [row[0] for row in conn.execute("SELECT id FROM events")]

    await check_baseline(client, stored)


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    require_postgres()
    async with fresh_schema() as name:
        yield name


async def test_the_postgres_group_commit_baseline_stores_each_event_once(
    aiohttp_client: Callable[[web.Application], Awaitable[Client]], schema: str
) -> None:
    client = await aiohttp_client(await baselines.grouped_postgres_app(POSTGRES_URL, schema))

    async def stored() -> list[str]:
        conn = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
        try:
            return [row[0] for row in await conn.fetch("SELECT id FROM events")]
        finally:
            await conn.close()

    await check_baseline(client, stored)
