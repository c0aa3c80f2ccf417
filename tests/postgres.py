"""Postgres for the tests: a fresh schema per test in one database, dropped afterwards.

``RECEIVER_TEST_POSTGRES_URL`` names the database (default: the local ``test`` database). A
schema is created and dropped in milliseconds, and its random name keeps concurrent test runs
(several checkouts, CI) apart: tables, advisory locks and notifications are all per schema.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from receiver.config import StoreSettings
from tests.conftest import require_service

POSTGRES_URL = os.environ.get(
    "RECEIVER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


def require_postgres() -> None:
    """Skip (or fail under RECEIVER_REQUIRE_SERVICES=1) unless Postgres accepts connections."""
    parts = urlsplit(POSTGRES_URL)
    require_service("PostgreSQL", parts.hostname or "127.0.0.1", parts.port or 5432)


def new_schema_name() -> str:
    return "receiver_test_" + uuid.uuid4().hex[:16]


@asynccontextmanager
async def fresh_schema() -> AsyncIterator[str]:
    """A schema name no one uses yet (the store creates it); dropped with its tables at exit."""
    import asyncpg

    name = new_schema_name()
    try:
        yield name
    finally:
        conn = await asyncpg.connect(POSTGRES_URL)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        finally:
            await conn.close()


def store_settings(schema: str, **overrides: object) -> StoreSettings:
    """Settings for a Postgres store in ``schema`` of the test database."""
    values: dict[str, object] = {"url": POSTGRES_URL, "schema": schema, "pool_size": 4}
    values.update(overrides)
    return StoreSettings(**values)  # type: ignore[arg-type]
