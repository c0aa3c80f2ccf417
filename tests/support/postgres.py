"""Postgres for the tests: a fresh schema per test in one database, dropped afterwards.

``RECEIVER_TEST_POSTGRES_URL`` names the database (default: the local ``test`` database). A
schema is created and dropped in milliseconds, and its random name keeps concurrent test runs
(several checkouts, CI) apart: tables, advisory locks and notifications are all per schema.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from receiver.config.settings import StoreSettings
from tests.support.helpers import free_port
from tests.support.services import require_service

POSTGRES_URL = os.environ.get(
    "RECEIVER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


#: The sessions (but this one) holding or waiting for a lock on anything in the schema ``$1``.
END_SESSIONS_IN_SCHEMA = """
SELECT pg_terminate_backend(l.pid)
FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND l.pid <> pg_backend_pid()
GROUP BY l.pid
"""


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
            # A process the test killed may leave its server-side session behind, holding or
            # waiting for locks in the schema until it notices: end those sessions first, or
            # the DROP waits for them (and may deadlock with one).
            await conn.execute(END_SESSIONS_IN_SCHEMA, name)
            await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        finally:
            await conn.close()


def store_settings(schema: str, **overrides: object) -> StoreSettings:
    """Settings for a Postgres store in ``schema`` of the test database."""
    values: dict[str, object] = {"url": POSTGRES_URL, "schema": schema, "pool_size": 4}
    values.update(overrides)
    return StoreSettings(**values)  # type: ignore[arg-type]


def url_with(**params: str) -> str:
    """The test database url with query parameters added (e.g. ``application_name``)."""
    parts = urlsplit(POSTGRES_URL)
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return parts._replace(query=f"{parts.query}&{query}" if parts.query else query).geturl()


async def terminate_backends(application_name: str) -> int:
    """``pg_terminate_backend`` every connection with that application name: a dropped link."""
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        killed = await conn.fetchval(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = $1 AND pid <> pg_backend_pid()) t",
            application_name,
        )
    finally:
        await conn.close()
    return int(killed)


async def shared_buffers_bytes() -> int:
    """The test server's ``shared_buffers``, in bytes (its pages times its block size)."""
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        return int(
            await conn.fetchval(
                "SELECT setting::bigint * current_setting('block_size')::bigint "
                "FROM pg_settings WHERE name = 'shared_buffers'"
            )
        )
    finally:
        await conn.close()


class TcpProxy:
    """A local port forwarding to Postgres that a test can take down and bring back.

    :meth:`stop` closes the port and cuts every forwarded connection (what clients see when the
    database restarts or the network fails); :meth:`start` opens the same port again.
    :meth:`hold` keeps every connection open but forwards nothing (a hung database or a silent
    network) until :meth:`resume`.
    """

    def __init__(self, target_host: str = "127.0.0.1", target_port: int = 5432) -> None:
        parts = urlsplit(POSTGRES_URL)
        self.target_host = parts.hostname or target_host
        self.target_port = parts.port or target_port
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()

    def url(self, **params: str) -> str:
        """The test database url, through this proxy."""
        parts = urlsplit(url_with(**params) if params else POSTGRES_URL)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        return parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host).geturl()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    def hold(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.transport.abort()
            self._tasks.discard(task)
            return
        self._writers.add(up_writer)
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for w in (writer, up_writer):
                w.transport.abort()
                self._writers.discard(w)
            self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            await self._flowing.wait()
            writer.write(data)
            await writer.drain()
        writer.transport.abort()
