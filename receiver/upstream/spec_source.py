"""Where the two OpenAPI documents come from: the baseline shipped with the release, and the
upstream's own ``GET {base_url}/openapi.json``.

The baseline (``receiver/upstream/spec/baseline.json``) is the upstream as its interface
specification describes it at the revision this release was built and tested against, written
for what the receiver uses: the operations it calls, the objects it reads, the webhook body and
the error body, promising nothing the specification does not.

Reading the upstream's document is bounded: one request within ``api.timeout_seconds`` (it
carries the API key when there is one, and the pinned ``Service-API-Version``), a body read in
chunks and refused past :data:`MAX_SPEC_BYTES` (so a huge document never sits in memory), JSON
that must be an OpenAPI 3.0 or 3.1 document. Every way it can fail is a :class:`SpecError` of one
line.
"""

from __future__ import annotations

import functools
import time
from importlib import resources
from typing import Any

import aiohttp
import orjson

from receiver import __version__
from receiver.config.settings import ApiSettings
from receiver.logs import redact_url
from receiver.observe.metrics import Metrics
from receiver.upstream.openapi import Document, SpecError

#: The largest document read; anything larger is refused as it streams in.
MAX_SPEC_BYTES = 10 * 1024 * 1024
SPEC_ENDPOINT = "/openapi.json"
_CHUNK_BYTES = 64 * 1024
_VERSION_HEADER = "Service-API-Version"


@functools.cache
def baseline() -> Document:
    """The document this release was built against (read once)."""
    text = resources.files("receiver.upstream").joinpath("spec", "baseline.json").read_bytes()
    return Document(orjson.loads(text))


async def read_upstream_document(
    session: aiohttp.ClientSession, api: ApiSettings, *, metrics: Metrics | None = None
) -> Document:
    """The upstream's ``/openapi.json``; SpecError (one line) when it cannot be read or used."""
    url = api.base_url.rstrip("/") + SPEC_ENDPOINT
    shown = redact_url(url)
    headers = {
        "Accept": "application/json",
        "User-Agent": f"receiver/{__version__}",
        _VERSION_HEADER: api.version,
    }
    if api.api_key:
        headers["Authorization"] = f"Bearer {api.api_key}"
    status = "error"
    started = time.perf_counter()
    try:
        async with session.get(
            url,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=api.timeout_seconds),
            allow_redirects=False,
        ) as resp:
            status = str(resp.status)
            if resp.status != 200:
                hint = " (a redirect: check api.base_url)" if 300 <= resp.status < 400 else ""
                raise SpecError(f"{shown} answered {resp.status}{hint}")
            body = await _read_bounded(resp, shown)
    except TimeoutError:
        status = "timeout"
        raise SpecError(f"{shown} did not answer within {api.timeout_seconds:g}s") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise SpecError(f"{shown} could not be reached: {_describe(exc)}") from None
    finally:
        if metrics is not None:
            metrics.upstream_requests.labels(SPEC_ENDPOINT, status).inc()
            metrics.upstream_request_seconds.labels(SPEC_ENDPOINT).observe(
                time.perf_counter() - started
            )
    return parse_document(body, shown)


def parse_document(body: bytes, source: str = "the document") -> Document:
    """An OpenAPI document from its bytes; SpecError naming ``source`` when it is not one."""
    try:
        raw: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise SpecError(f"{source} is not JSON") from None
    try:
        return Document(raw)
    except SpecError as exc:
        raise SpecError(f"{source}: {exc.message}") from None


async def _read_bounded(resp: aiohttp.ClientResponse, shown: str) -> bytes:
    limit = f"{MAX_SPEC_BYTES // (1024 * 1024)} MB"
    if resp.content_length is not None and resp.content_length > MAX_SPEC_BYTES:
        raise SpecError(f"{shown} is {resp.content_length} bytes, larger than {limit}: refused")
    body = bytearray()
    async for chunk in resp.content.iter_chunked(_CHUNK_BYTES):
        if len(body) + len(chunk) > MAX_SPEC_BYTES:
            raise SpecError(f"{shown} is larger than {limit}: refused")
        body += chunk
    return bytes(body)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"{exc.host}:{exc.port}: {exc.os_error.strerror or exc.os_error}"
    return type(exc).__name__
