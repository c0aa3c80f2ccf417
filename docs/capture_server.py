"""A stand-in for Slack and for an internal HTTP consumer: prints every request, answers 200.

    python docs/capture_server.py [--port 9300] [--secret S]

With ``--secret`` (the ``http`` sink's secret) each request's ``Service-Signature`` is checked
with the receiver's own :func:`receiver.signature.verify` and the result printed.
"""

from __future__ import annotations

import argparse
import json
import time

from aiohttp import web

from receiver.errors import SignatureError
from receiver.signature import verify


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9300)
    parser.add_argument("--secret", help="verify Service-Signature with this secret")
    args = parser.parse_args()

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        print(f"--- {request.method} {request.path}", flush=True)
        for name in ("Content-Type", "Service-Signature", "Service-Event-Id", "X-Service-Event"):
            if name in request.headers:
                print(f"{name}: {request.headers[name]}")
        if args.secret and "Service-Signature" in request.headers:
            try:
                verify(
                    secrets=[args.secret],
                    body=body,
                    header=request.headers["Service-Signature"],
                    now=time.time(),
                    tolerance_seconds=300,
                )
                print("signature: valid")
            except SignatureError as exc:
                print(f"signature: INVALID ({exc.message})")
        try:
            print(json.dumps(json.loads(body), indent=2, ensure_ascii=False)[:1500], flush=True)
        except ValueError:
            print(body[:1500].decode("utf-8", "replace"), flush=True)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    web.run_app(app, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
