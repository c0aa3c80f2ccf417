"""The upstream API client: jobs, assets and webhook subscriptions.

Every failure is translated here into the receiver's exception tree (no aiohttp exception leaves
this module)::

    429                              TransientError (retry_after from Retry-After when given;
                                     with it, the client sends nothing until then:
                                     :mod:`receiver.upstream.retry_after_gate`)
    5xx, 3xx, network error, timeout TransientError
    2xx with a body that is not JSON TransientError
      or has no ``data``
    401, 403                         UpstreamAuthError (logged at error level; the caller retries)
    400 naming the API version       VersionRefused (logged once; retried, never dead:
                                     :mod:`receiver.upstream.pin`)
    404                              PermanentError ("job <id> not found upstream")
    408, 409, 425                    TransientError (the request may succeed when repeated)
    any other 4xx                    PermanentError naming the status and the upstream error code

Each request is counted in ``receiver_upstream_requests_total{endpoint,status}`` (the endpoint is
the route template, the status the HTTP status or ``timeout`` / ``error``) and timed in
``receiver_upstream_request_seconds{endpoint}``, and noted for the event's timeline
(:mod:`receiver.observe.timeline`), from which, with tracing on, it becomes a CLIENT span of the
event's trace. The API
key and signed URLs' query strings are never logged, put in an exception message or a span.

Every request carries ``Service-API-Version: {api.version}``; every answer's ``Deprecation`` and
``Sunset`` headers are taken in by :mod:`receiver.upstream.deprecation`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any, NoReturn
from urllib.parse import quote

import aiohttp

from receiver import __version__
from receiver.config.settings import ApiSettings
from receiver.errors import PermanentError, TransientError, UpstreamAuthError
from receiver.logs import get_logger, redact_url
from receiver.observe.metrics import Metrics
from receiver.observe.timeline import Call, note_call
from receiver.retry import parse_retry_after
from receiver.upstream.conformance import checked, checked_page
from receiver.upstream.deprecation import DeprecationWatch
from receiver.upstream.pin import HEADER as VERSION_HEADER
from receiver.upstream.pin import VersionPin
from receiver.upstream.reads import (  # the routes of the operations declared there
    ASSET_ENDPOINT,
    COLLECTION_ASSETS_ENDPOINT,
    JOB_ENDPOINT,
    WEBHOOK_ENDPOINT,
    WEBHOOKS_ENDPOINT,
)
from receiver.upstream.retry_after_gate import RetryAfterGate

log = get_logger(__name__)

#: The spec's largest page for list endpoints.
MAX_PAGE_SIZE = 100
#: The ``api.version`` a client pins unless told otherwise.
DEFAULT_API_VERSION = ApiSettings().version

#: Statuses in the 4xx range worth repeating as they are (timeout, conflict/busy, too early).
_RETRYABLE_4XX = frozenset({408, 409, 425})
#: The spec's long-poll ceiling for ``GET /jobs/{id}?wait=true``.
MAX_WAIT_SECONDS = 120.0
#: A guard against a list that never says it has no more pages.
_MAX_PAGES = 100
_MAX_MESSAGE = 300


class UpstreamClient:
    """A small client for the upstream REST API (``{base_url}`` already ends in ``/v1``).

    The aiohttp session is owned by the caller and shared; ``timeout`` bounds each request as a
    whole (connect, headers and body); ``api_version`` is sent as ``Service-API-Version``.
    """

    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        base_url: str,
        api_key: str,
        timeout: float,
        metrics: Metrics | None = None,
        api_version: str = DEFAULT_API_VERSION,
    ) -> None:
        self._session = session
        self._base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._timeout = timeout
        self._metrics = metrics
        #: The pinned version, and whether the upstream refuses it now.
        self.pin = VersionPin(api_version, metrics)
        #: What the upstream's answers say about retiring the endpoints used.
        self.deprecations = DeprecationWatch(metrics)
        #: Closed by a 429's Retry-After: no request is sent until it has passed.
        self.retry_after_gate = RetryAfterGate()
        # Every request's headers: built here only.
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "Accept": "application/json",
            "User-Agent": f"receiver/{__version__}",
            VERSION_HEADER: api_version,
        }

    @property
    def base_url(self) -> str:
        return self._base_url

    async def get_job(self, job_id: str, *, wait_seconds: float | None = None) -> dict[str, Any]:
        """The current job (``GET /jobs/{id}``).

        With ``wait_seconds`` the upstream long-polls (``wait=true``, capped at 120 s) until the
        job is completed or failed, then answers with the job as it is.
        """
        params: dict[str, str] | None = None
        timeout = self._timeout
        if wait_seconds is not None:
            wait = min(max(wait_seconds, 0.0), MAX_WAIT_SECONDS)
            params = {"wait": "true", "timeout": f"{wait:g}"}
            timeout += wait
        data = await self._request(
            "GET",
            JOB_ENDPOINT,
            f"/jobs/{_quote_id(job_id, 'job')}",
            what=f"job {job_id}",
            params=params,
            total_seconds=timeout,
        )
        return checked("job", _expect_object(data, f"job {job_id}"), self._metrics)

    async def get_asset(self, asset_id: str) -> dict[str, Any]:
        """The asset with a fresh signed ``file_url`` (``GET /assets/{id}``)."""
        data = await self._request(
            "GET",
            ASSET_ENDPOINT,
            f"/assets/{_quote_id(asset_id, 'asset')}",
            what=f"asset {asset_id}",
        )
        return checked("asset", _expect_object(data, f"asset {asset_id}"), self._metrics)

    async def list_webhooks(self) -> list[dict[str, Any]]:
        """The account's webhook subscriptions (``GET /webhooks``), every page."""
        hooks: dict[str, dict[str, Any]] = {}
        async for page, _pagination in self.pages(WEBHOOKS_ENDPOINT, "/webhooks", "webhooks"):
            for hook in page:
                hooks.setdefault(str(hook.get("id")), hook)
        return list(hooks.values())

    async def collection_assets_page(
        self, collection_id: str, *, offset: int = 0, limit: int = MAX_PAGE_SIZE
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """One page of ``GET /collections/{id}/assets`` (with fresh file URLs) and its
        ``meta.pagination`` (``{}`` when the upstream sent none)."""
        path = f"/collections/{_quote_id(collection_id, 'collection')}/assets"
        params = {"limit": str(min(max(limit, 1), MAX_PAGE_SIZE)), "offset": str(max(offset, 0))}
        what = f"assets of collection {collection_id}"
        data, meta = await self._request(
            "GET", COLLECTION_ASSETS_ENDPOINT, path, what=what, params=params, meta=True
        )
        return checked_page(_expect_list(data, what), _pagination(meta), self._metrics)

    async def pages(
        self, endpoint: str, path: str, what: str
    ) -> AsyncIterator[tuple[list[dict[str, Any]], dict[str, Any]]]:
        """Every page of a list endpoint, with its ``meta.pagination``.

        Pages are followed while ``meta.pagination.has_more`` is true, the offset growing by the
        returned limit, as the spec's list endpoints work; a page that adds nothing ends it.
        """
        params: dict[str, str] | None = None
        for _page in range(_MAX_PAGES):
            data, meta = await self._request(
                "GET", endpoint, path, what=what, params=params, meta=True
            )
            page, pagination = _expect_list(data, what), _pagination(meta)
            yield page, pagination
            if pagination.get("has_more") is not True or not page:
                return
            limit, offset = pagination.get("limit"), pagination.get("offset", 0)
            if not isinstance(limit, int) or not isinstance(offset, int):
                return
            params = {"limit": str(limit), "offset": str(offset + limit)}

    async def create_webhook(self, url: str, events: list[str] | None) -> dict[str, Any]:
        """Subscribe ``url`` to ``events`` (all when ``None``); the answer holds the secret."""
        body: dict[str, Any] = {"url": url}
        if events is not None:
            body["events"] = list(events)
        data = await self._request(
            "POST", WEBHOOKS_ENDPOINT, "/webhooks", what="webhook creation", json_body=body
        )
        return _expect_object(data, "webhook creation")

    async def delete_webhook(self, webhook_id: str) -> None:
        """Delete one webhook subscription (``DELETE /webhooks/{id}``)."""
        await self._request(
            "DELETE",
            WEBHOOK_ENDPOINT,
            f"/webhooks/{_quote_id(webhook_id, 'webhook')}",
            what=f"webhook {webhook_id}",
            expect_data=False,
        )

    async def _request(
        self,
        method: str,
        endpoint: str,
        path: str,
        *,
        what: str,
        params: dict[str, str] | None = None,
        json_body: dict[str, Any] | None = None,
        total_seconds: float | None = None,
        expect_data: bool = True,
        meta: bool = False,
    ) -> Any:
        """Send one request; the envelope's ``data`` (with ``meta=True``: ``(data, meta)``) or a
        translated exception."""
        if self._session.closed:
            raise TransientError(f"cannot fetch {what}: the HTTP session is closed")
        await self.retry_after_gate.pass_through(what)
        url = self._base_url + path
        total = total_seconds or self._timeout
        started_at = time.time()
        started = time.perf_counter()
        status_label = "error"
        try:
            async with self._session.request(
                method,
                url,
                params=params,
                json=json_body,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=total),
                allow_redirects=False,
            ) as resp:
                status_label = str(resp.status)
                body = await resp.read()
                status = resp.status
                retry_after_header = resp.headers.get("Retry-After")
                self.deprecations.observe(
                    endpoint,
                    status,
                    resp.headers.get("Deprecation"),
                    resp.headers.get("Sunset"),
                    resp.headers.getall("Link", []),
                )
        except TimeoutError as exc:  # includes aiohttp's ServerTimeoutError and friends
            status_label = "timeout"
            raise TransientError(f"upstream did not answer within {total:g}s for {what}") from exc
        except (aiohttp.ClientError, OSError) as exc:
            status_label = "error"
            raise TransientError(
                f"upstream request for {what} failed: {type(exc).__name__}"
                f"{_describe_network_error(exc)}"
            ) from exc
        finally:
            seconds = time.perf_counter() - started
            self._observe(endpoint, status_label, seconds)
            note_call(Call(method, endpoint, url, started_at, seconds, status_label))

        log.debug("upstream answered", endpoint=endpoint, method=method, status=status)
        if 200 <= status < 300:
            self.pin.accepted()
            if not expect_data:
                return None
            return self._data(body, status, what, meta=meta)
        self._raise_for_status(status, body, what, endpoint, retry_after_header)

    def _observe(self, endpoint: str, status: str, seconds: float) -> None:
        if self._metrics is None:
            return
        self._metrics.upstream_requests.labels(endpoint, status).inc()
        self._metrics.upstream_request_seconds.labels(endpoint).observe(seconds)

    def _data(self, body: bytes, status: int, what: str, *, meta: bool = False) -> Any:
        try:
            envelope = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise TransientError(
                f"upstream answered {status} for {what} with a body that is not JSON"
            ) from exc
        if not isinstance(envelope, dict) or envelope.get("data") is None:
            raise TransientError(f"upstream answered {status} for {what} without data")
        if meta:
            return envelope["data"], envelope.get("meta")
        return envelope["data"]

    def _raise_for_status(
        self,
        status: int,
        body: bytes,
        what: str,
        endpoint: str,
        retry_after_header: str | None,
    ) -> NoReturn:
        code, detail, param = self._error_detail(body)
        summary = f"upstream answered {status}{f' {code}' if code else ''} for {what}"
        if detail:
            summary = f"{summary}: {detail}"
        if status == 400 and (refused := self.pin.refusal(endpoint, summary, code, detail, param)):
            raise refused
        retry_after = parse_retry_after(retry_after_header)
        if status == 429 and retry_after is not None:
            self.retry_after_gate.close_for(retry_after)
        if status == 429 or status >= 500:
            raise TransientError(summary, retry_after=retry_after, status=status)
        if status in (401, 403):
            # Once per refused response; the key itself is never logged.
            log.error(
                "upstream refused the API key",
                status=status,
                code=code,
                endpoint=endpoint,
                base_url=redact_url(self._base_url),
            )
            raise UpstreamAuthError(summary, status=status)
        if status == 404:
            raise PermanentError(f"{what} not found upstream", status=status)
        if status in _RETRYABLE_4XX:
            raise TransientError(summary, retry_after=retry_after, status=status)
        if 300 <= status < 400:
            raise TransientError(f"{summary} (a redirect: check api.base_url)", status=status)
        raise PermanentError(summary, status=status)

    def _error_detail(self, body: bytes) -> tuple[str | None, str | None, str | None]:
        """The upstream ``error.code``, ``error.message`` and ``error.param``, when the body
        has them."""
        try:
            envelope = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return None, None, None
        error = envelope.get("error") if isinstance(envelope, dict) else None
        if not isinstance(error, dict):
            return None, None, None
        code, message, param = error.get("code"), error.get("message"), error.get("param")
        return (
            self._clean(code) if isinstance(code, str) else None,
            self._clean(message) if isinstance(message, str) else None,
            self._clean(param) if isinstance(param, str) else None,
        )

    def _clean(self, text: str) -> str:
        """Upstream text made safe for a message: short, one line, never the key."""
        text = " ".join(text.split())[:_MAX_MESSAGE]
        if self._api_key and len(self._api_key) >= 8:
            text = text.replace(self._api_key, "<redacted>")
        return text


def _quote_id(value: str, kind: str) -> str:
    """An id as one path segment; empty and dot segments would address another resource."""
    if value in ("", ".", ".."):
        raise PermanentError(f"invalid {kind} id {value!r}")
    return quote(value, safe="")


def _expect_list(data: Any, what: str) -> list[dict[str, Any]]:
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise TransientError(f"upstream answered {what} with data that is not a list of objects")
    return data


def _pagination(meta: Any) -> dict[str, Any]:
    pagination = meta.get("pagination") if isinstance(meta, dict) else None
    return pagination if isinstance(pagination, dict) else {}


def _expect_object(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise TransientError(f"upstream answered {what} with data that is not an object")
    return data


def _describe_network_error(exc: BaseException) -> str:
    """A short reason for a network error, without URLs (they may carry signatures)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f" ({exc.host}:{exc.port}: {exc.os_error.strerror or exc.os_error})"
    if isinstance(exc, aiohttp.ClientResponseError):
        return f" ({exc.status})"
    return ""
