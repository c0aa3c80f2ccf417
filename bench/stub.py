"""A fast, stateless upstream stand-in for the benchmarks (the simulator keeps state per job).

Every id is valid; everything about a job or asset is derived from its id, so any number of
events can be processed without registering them first::

    GET  /v1/jobs/{id}      a completed ``logo`` job whose asset is ``ast-{id}``
    GET  /v1/assets/{id}    that asset, ``file_url`` pointing at /files/{id}.png
    GET  /files/{name}      a small PNG (no added latency, like a CDN)
    POST /capture           an HTTP sink's target: counts and answers 200
    GET  /stats             request counts as JSON
    GET  /healthz

``--latency`` is added to every ``/v1`` call (bench/e2e uses 0.1 s)::

    python -m bench.stub --port 8090 [--latency 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections import Counter

from aiohttp import web

from receiver.cli.common import run_async
from receiver.simulator import png_bytes

PNG = png_bytes(label="receiver benchmark asset")
#: Every job and asset carries the members the spec requires (the receiver checks them).
CREATED_AT = "2026-08-20T12:00:00+00:00"


def job_id_of(asset_id: str) -> str:
    return asset_id.removeprefix("ast-")


def create_app(latency: float) -> web.Application:
    counts: Counter[str] = Counter()

    def origin(request: web.Request) -> str:
        return f"http://{request.host}"

    async def job(request: web.Request) -> web.Response:
        counts["job"] += 1
        if latency:
            await asyncio.sleep(latency)
        job_id = request.match_info["id"]
        return web.json_response(
            {
                "data": {
                    "id": job_id,
                    "status": "completed",
                    "type": "logo",
                    "collection_id": "bench",
                    "item_name": f"item-{job_id[-2:]}",
                    "cost_credits": 5,
                    "error": None,
                    "urls": {"logo": f"{origin(request)}/files/ast-{job_id}.png"},
                    "created_at": CREATED_AT,
                    "updated_at": CREATED_AT,
                }
            }
        )

    async def asset(request: web.Request) -> web.Response:
        counts["asset"] += 1
        if latency:
            await asyncio.sleep(latency)
        asset_id = request.match_info["id"]
        return web.json_response(
            {
                "data": {
                    "id": asset_id,
                    "type": "logo",
                    "status": "completed",
                    "collection_id": "bench",
                    "file_url": f"{origin(request)}/files/{asset_id}.png?expires=1&sig=bench",
                    "cdn_url": None,
                    "item_id": None,
                    "metadata": {"job_id": job_id_of(asset_id)},
                    "created_at": CREATED_AT,
                }
            }
        )

    async def file(_request: web.Request) -> web.Response:
        counts["file"] += 1
        return web.Response(body=PNG, content_type="image/png")

    async def capture(request: web.Request) -> web.Response:
        await request.read()
        counts["capture"] += 1
        return web.json_response({"ok": True})

    async def stats(_request: web.Request) -> web.Response:
        return web.json_response(dict(counts))

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.add_routes(
        [
            web.get("/v1/jobs/{id}", job),
            web.get("/v1/assets/{id}", asset),
            web.get("/files/{name}", file),
            web.post("/capture", capture),
            web.get("/stats", stats),
            web.get("/healthz", healthz),
        ]
    )
    return app


async def serve(port: int, latency: float) -> None:
    runner = web.AppRunner(create_app(latency), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    run_async(serve(args.port, args.latency))
