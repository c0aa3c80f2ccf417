"""The two baselines the receiver's intake is measured against, each a tiny aiohttp server.

- ``bare``: reads the body and answers 200 (the ceiling: aiohttp itself).
- ``sqlite``: the hand-written alternative: the same handler verifying the signature, then one
  aiosqlite ``INSERT`` and ``commit`` per request (WAL, the same ``synchronous`` as the receiver).
  The insert and its commit hold a lock: one connection shared without it would mix requests in
  one transaction (a rollback for one request would undo the others' inserts), so each request
  gets its own transaction, as the words "one INSERT + commit per request" mean.

Both run on the same event loop as ``receiver serve`` (uvloop when installed), so the
comparison measures the handlers, not the loops::

    python -m bench.ingest.baselines bare --port 8081
    python -m bench.ingest.baselines sqlite --port 8082 --db /tmp/b.db --synchronous full
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time

import aiosqlite
from aiohttp import web

from bench.common import SECRET
from receiver.cli.common import run_async
from receiver.errors import SignatureError
from receiver.signature import SIGNATURE_HEADER, verify

CREATE = "CREATE TABLE IF NOT EXISTS events (id TEXT PRIMARY KEY, body BLOB, received_at REAL)"
INSERT = "INSERT INTO events (id, body, received_at) VALUES (?, ?, ?)"


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
        try:
            verify(
                secrets=[SECRET],
                body=body,
                header=request.headers.get(SIGNATURE_HEADER),
                now=time.time(),
                tolerance_seconds=300,
            )
        except SignatureError:
            return web.Response(status=401)
        event = json.loads(body)
        async with lock:
            await db.execute(INSERT, (event["id"], body, time.time()))
            await db.commit()
        return web.Response(text="ok")

    async def close(_app: web.Application) -> None:
        await db.close()

    app = web.Application()
    app.add_routes([web.post("/webhooks", handle), web.get("/healthz", healthz)])
    app.on_cleanup.append(close)
    return app


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
    else:
        app = await sqlite_app(args.db, args.synchronous)
    await serve(app, args.port)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("bare", "sqlite"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--db", default="baseline.db")
    parser.add_argument("--synchronous", choices=("full", "normal"), default="full")
    run_async(main(parser.parse_args()))
