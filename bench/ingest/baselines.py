"""The baselines the receiver's intake is measured against, each a tiny aiohttp server.

- ``bare``: reads the body and answers 200 (the ceiling: aiohttp itself).
- ``sqlite``: the hand-written alternative: the same handler verifying the signature, then one
  aiosqlite ``INSERT`` and ``commit`` per request (WAL, the same ``synchronous`` as the receiver).
  The insert and its commit hold a lock: one connection shared without it would mix requests in
  one transaction (a rollback for one request would undo the others' inserts), so each request
  gets its own transaction, as the words "one INSERT + commit per request" mean.
- ``grouped``: the least any SQLite inbox can do: the same handler, its requests gathered by the
  receiver's own group commit (:class:`~receiver.store.batching.GroupCommit`) and written in one
  transaction a group into one table (the id as its key, the body, the time): no other index, no
  deliveries, no ledger, every statement of a group in one hand-off to the connection's thread.
  What this reaches is the most an SQLite store that keeps each body and knows its ids can reach
  on the machine.
- ``grouped-postgres``: the same on PostgreSQL (asyncpg, one statement a group, two groups in
  flight, as the receiver's Postgres intake), in a schema of its own.

All run on the same event loop as ``receiver serve`` (uvloop when installed), so the
comparison measures the handlers, not the loops::

    python -m bench.ingest.baselines bare --port 8081
    python -m bench.ingest.baselines sqlite --port 8082 --db /tmp/b.db --synchronous full
    python -m bench.ingest.baselines grouped --port 8083 --db /tmp/g.db --synchronous full
    python -m bench.ingest.baselines grouped-postgres --port 8084 --postgres URL --schema S
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sqlite3
import time
from collections.abc import Awaitable, Callable

import aiosqlite
from aiohttp import web

from bench.common import SECRET
from receiver.cli.common import run_async
from receiver.errors import SignatureError
from receiver.signature import SIGNATURE_HEADER, verify
from receiver.store.batching import GroupCommit

CREATE = "CREATE TABLE IF NOT EXISTS events (id TEXT PRIMARY KEY, body BLOB, received_at REAL)"
INSERT = "INSERT INTO events (id, body, received_at) VALUES (?, ?, ?)"
# A group goes in with one multi-row statement a chunk, answering the ids it inserted.
INSERT_NEW = "INSERT OR IGNORE INTO events (id, body, received_at) VALUES {rows} RETURNING id"
CHUNK = 256
#: One stored event of the group-commit baselines: its id, body and time of arrival.
Row = tuple[str, bytes, float]


async def healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def bare_app() -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text="ok")

    app = web.Application()
    app.add_routes([web.post("/webhooks", handle), web.get("/healthz", healthz)])
    return app


async def sqlite_app(db_path: str, synchronous: str) -> web.Application:
    db = await aiosqlite.connect(db_path)
    await db.execute("PRAGMA journal_mode = WAL")
    await db.execute(f"PRAGMA synchronous = {synchronous.upper()}")
    await db.execute(CREATE)
    await db.commit()
    lock = asyncio.Lock()

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        event_id = signed_event(body, request.headers.get(SIGNATURE_HEADER))
        if event_id is None:
            return web.Response(status=401)
        async with lock:
            await db.execute(INSERT, (event_id, body, time.time()))
            await db.commit()
        return web.Response(text="ok")

    async def close(_app: web.Application) -> None:
        await db.close()

    app = web.Application()
    app.add_routes([web.post("/webhooks", handle), web.get("/healthz", healthz)])
    app.on_cleanup.append(close)
    return app


def _write_group(conn: sqlite3.Connection, rows: list[Row]) -> list[bool]:
    """One group's transaction, on the connection's thread: each row, whether it was new."""
    inserted: set[str] = set()
    conn.execute("BEGIN IMMEDIATE")
    try:
        for start in range(0, len(rows), CHUNK):
            chunk = rows[start : start + CHUNK]
            sql = INSERT_NEW.format(rows=", ".join(["(?, ?, ?)"] * len(chunk)))
            params = [value for row in chunk for value in row]
            inserted.update(id_ for (id_,) in conn.execute(sql, params))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return [row[0] in inserted for row in rows]


CREATE_PG = (
    'CREATE TABLE IF NOT EXISTS "{schema}".events '
    "(id TEXT PRIMARY KEY, body BYTEA, received_at DOUBLE PRECISION)"
)
# The Postgres form: the group as arrays, the ids it inserted answered.
INSERT_NEW_PG = """
INSERT INTO events (id, body, received_at)
SELECT * FROM unnest($1::text[], $2::bytea[], $3::double precision[])
ON CONFLICT (id) DO NOTHING RETURNING id
"""


def signed_event(body: bytes, header: str | None) -> str | None:
    """The event id of a body whose signature holds, else None."""
    try:
        verify(secrets=[SECRET], body=body, header=header, now=time.time(), tolerance_seconds=300)
    except SignatureError:
        return None
    return str(json.loads(body)["id"])


def grouped_handler(
    groups: GroupCommit[Row, bool],
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        event_id = signed_event(body, request.headers.get(SIGNATURE_HEADER))
        if event_id is None:
            return web.Response(status=401)
        await groups.submit((event_id, body, time.time()))
        return web.Response(text="ok")

    return handle


def grouped_web_app(
    groups: GroupCommit[Row, bool], close: Callable[[], Awaitable[None]]
) -> web.Application:
    async def cleanup(_app: web.Application) -> None:
        await groups.drain()
        await close()

    app = web.Application()
    app.add_routes([web.post("/webhooks", grouped_handler(groups)), web.get("/healthz", healthz)])
    app.on_cleanup.append(cleanup)
    return app


async def grouped_postgres_app(url: str, schema: str) -> web.Application:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await conn.execute(CREATE_PG.format(schema=schema))
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(
        url, min_size=2, max_size=2, server_settings={"search_path": f'"{schema}"'}
    )

    async def write_rows(rows: list[Row]) -> list[bool]:
        ids, bodies, times = zip(*rows, strict=True)
        async with pool.acquire() as db:
            inserted = {r[0] for r in await db.fetch(INSERT_NEW_PG, ids, bodies, times)}
        return [row[0] in inserted for row in rows]

    groups: GroupCommit[Row, bool] = GroupCommit(write_rows, max_batch=1000, max_in_flight=2)
    return grouped_web_app(groups, pool.close)


async def grouped_app(db_path: str, synchronous: str) -> web.Application:
    db = await aiosqlite.connect(db_path, isolation_level=None)
    await db.execute("PRAGMA journal_mode = WAL")
    await db.execute(f"PRAGMA synchronous = {synchronous.upper()}")
    await db.execute(CREATE)

    async def write_rows(rows: list[Row]) -> list[bool]:
        result: list[bool] = await db._execute(  # type: ignore[no-untyped-call]
            _write_group, db._conn, rows
        )
        return result

    groups: GroupCommit[Row, bool] = GroupCommit(write_rows, max_batch=1000)
    return grouped_web_app(groups, db.close)


async def serve(app: web.Application, port: int) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


async def main(args: argparse.Namespace) -> None:
    if args.kind == "bare":
        app = bare_app()
    elif args.kind == "grouped":
        app = await grouped_app(args.db, args.synchronous)
    elif args.kind == "grouped-postgres":
        app = await grouped_postgres_app(args.postgres, args.schema)
    else:
        app = await sqlite_app(args.db, args.synchronous)
    await serve(app, args.port)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("bare", "sqlite", "grouped", "grouped-postgres"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--db", default="baseline.db")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--schema", default="receiver_bench_grouped")
    parser.add_argument("--synchronous", choices=("full", "normal"), default="full")
    run_async(main(parser.parse_args()))
