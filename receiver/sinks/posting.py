"""One HTTP POST from a sink, with the answer mapped to a delivery result.

Shared by the ``http`` and ``slack`` sinks: any 2xx is success; 429 (and 503) honour
``Retry-After``; the sink decides which other statuses are permanent (dead at once); everything
else, network errors included, is a failed attempt to retry. Redirects are not followed: a POST
that is redirected did not arrive. Error texts show the URL only as the sink chooses
(``shown_url``), since a chat hook's path is itself a secret.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import aiohttp

from receiver.errors import PermanentError, TransientError
from receiver.retry import parse_retry_after

SNIPPET_BYTES = 300


def origin(url: str) -> str:
    """``scheme://host[:port]`` of a URL: all of it that is safe to show for a chat hook."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparseable url>"
    return f"{parts.scheme}://{parts.hostname or ''}{port}"


async def _snippet(response: aiohttp.ClientResponse) -> str:
    try:
        raw = await response.content.read(SNIPPET_BYTES)
    except (aiohttp.ClientError, TimeoutError):
        return ""
    return " ".join(raw.decode("utf-8", "replace").split())


async def post(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    shown_url: str,
    is_permanent: Callable[[int], bool],
) -> int:
    """POST ``body``; return the 2xx status or raise a DeliveryError naming ``shown_url``."""
    try:
        async with session.post(
            url, data=body, headers=dict(headers), allow_redirects=False
        ) as response:
            status = response.status
            if 200 <= status < 300:
                return status
            detail = await _snippet(response)
            retry_after = (
                parse_retry_after(response.headers.get("Retry-After"))
                if status in (429, 503)
                else None
            )
    except aiohttp.ClientError as exc:
        reason = str(exc).replace(url, shown_url) or type(exc).__name__
        raise TransientError(f"POST {shown_url}: {reason}") from None
    message = f"POST {shown_url}: HTTP {status}" + (f" {detail}" if detail else "")
    if is_permanent(status):
        raise PermanentError(message)
    raise TransientError(message, retry_after=retry_after)
