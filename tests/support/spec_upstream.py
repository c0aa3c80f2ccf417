"""A hand-written upstream for the spec conformance tests: it answers exactly what a test gives.

Not the project's simulator (written by the same hands as the receiver): each test writes the
JSON of the job, asset, collection page or error body itself, in the form
``upstream-api-spec.md`` allows, and this app serves it byte for byte.

Answers are scripted per request path (a collection's asset list per path and ``offset``):
each request takes the next answer of the script and the last one repeats, so "two 429s, then
the job" is ``upstream.on(path, error(429, ...), error(429, ...), ok(job))``. A path without a
script answers the spec's 404 body. Every request is recorded with its query, headers and
arrival time.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: status, headers and the exact body bytes."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


def ok(data: Any, meta: Any = None, **extra: Any) -> Answer:
    """The spec's success envelope ``{data, meta?}`` (``extra``: more top-level members)."""
    envelope: dict[str, Any] = {"data": data, **extra}
    if meta is not None:
        envelope["meta"] = meta
    return Answer(200, json.dumps(envelope).encode(), {"Content-Type": "application/json"})


def error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Answer:
    """The spec's error body with only its two required members."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    return Answer(status, body, {"Content-Type": "application/json", **(headers or {})})


def raw(status: int, text: str, content_type: str = "text/html") -> Answer:
    """A body that is not the spec's JSON (a proxy's error page)."""
    return Answer(status, text.encode(), {"Content-Type": content_type})


def file_answer(body: bytes, content_type: str = "image/png") -> Answer:
    """A file's bytes, as a signed URL serves them."""
    return Answer(200, body, {"Content-Type": content_type})


NOT_SCRIPTED = error(404, "not_found", "Resource not found")


@dataclass(frozen=True)
class Seen:
    """One request the upstream received."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    at: float  # time.monotonic() on arrival


class SpecUpstream:
    """The app; ``base_url`` (ending in ``/v1``) and ``origin`` are set once it is served."""

    def __init__(self) -> None:
        self.scripts: dict[str, list[Answer]] = {}
        self.requests: list[Seen] = []
        self.base_url = ""
        self.origin = ""

    # -- scripting --------------------------------------------------------------------------

    def on(self, key: str, *answers: Answer) -> None:
        """Answer requests for ``key`` (a path, or ``path?offset=N`` for a list) in order."""
        assert answers
        self.scripts[key] = list(answers)

    def job(self, job_id: str, *answers: Answer) -> None:
        self.on(f"/v1/jobs/{job_id}", *answers)

    def asset(self, asset_id: str, *answers: Answer) -> None:
        self.on(f"/v1/assets/{asset_id}", *answers)

    def page(self, collection_id: str, offset: int, *answers: Answer) -> None:
        self.on(f"/v1/collections/{collection_id}/assets?offset={offset}", *answers)

    def serve_file(self, name: str, *answers: Answer) -> str:
        """Serve a file at ``/files/{name}``; its signed URL."""
        self.on(f"/files/{name}", *answers)
        return self.file_url(name)

    def file_url(self, name: str) -> str:
        return f"{self.origin}/files/{name}?sig=abc123&expires=9999999999"

    # -- what was asked ---------------------------------------------------------------------

    def to(self, path: str) -> list[Seen]:
        """The requests for ``path`` (without query), in order."""
        return [r for r in self.requests if r.path == path]

    def calls(self) -> list[Seen]:
        """The requests but those for the OpenAPI document (which ``receiver serve`` reads at
        start, whatever the events), in order."""
        return [r for r in self.requests if r.path != "/v1/openapi.json"]

    # -- serving ----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.requests.append(
            Seen(
                request.method,
                request.path,
                dict(request.query),
                dict(request.headers),
                time.monotonic(),
            )
        )
        key = request.path
        if key.startswith("/v1/collections/") and key.endswith("/assets"):
            key = f"{key}?offset={request.query.get('offset', '0')}"
        script = self.scripts.get(key)
        answer = (script.pop(0) if len(script) > 1 else script[0]) if script else NOT_SCRIPTED
        return web.Response(status=answer.status, body=answer.body, headers=answer.headers)


async def serve_spec_upstream(aiohttp_server: Any) -> SpecUpstream:
    """A :class:`SpecUpstream` on a real aiohttp test server, its URLs set."""
    upstream = SpecUpstream()
    server = await aiohttp_server(upstream.app())
    upstream.origin = str(server.make_url("")).rstrip("/")
    upstream.base_url = f"{upstream.origin}/v1"
    return upstream
