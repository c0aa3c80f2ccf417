"""An OTLP/HTTP collector stand-in for the ``sqlite-traced`` target of bench.ingest: takes every
``POST /v1/traces`` and answers 200 with an empty export response, keeping nothing; the spans
still leave the receiver as they would for a real collector (batched, encoded, sent)::

    python -m bench.ingest.collector --port PORT
"""

from __future__ import annotations

import argparse
import asyncio

from aiohttp import web

from bench.ingest.baselines import healthz, serve

# An empty ExportTraceServiceResponse is zero bytes of protobuf.
EMPTY_RESPONSE = b""


def collector_app() -> web.Application:
    async def traces(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=EMPTY_RESPONSE, content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.add_routes([web.post("/v1/traces", traces), web.get("/healthz", healthz)])
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(serve(collector_app(), parser.parse_args().port))


if __name__ == "__main__":
    main()
