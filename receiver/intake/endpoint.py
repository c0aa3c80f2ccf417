"""The public webhook endpoint: size-capped read, signature, validation, durable store, 2xx.

Nothing slow happens here: no upstream call and no sink runs inside the request. The answer is
2xx only once the event is committed to the inbox; any failure to store answers 503 so the
upstream retries, and no request, however malformed, gets a 500.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

from receiver import faults
from receiver.config.settings import Settings
from receiver.errors import PayloadError, SignatureError, StoreError
from receiver.logs import get_logger
from receiver.observe.loop_metrics import Count
from receiver.observe.metrics import WEBHOOK_OUTCOMES, Metrics
from receiver.secrets import SecretBox
from receiver.signature import LEGACY_SIGNATURE_HEADER, SIGNATURE_HEADER
from receiver.signature import check as check_signature
from receiver.store.base import Store
from receiver.store.records import NewEvent

log = get_logger("receiver.intake")

# Headers kept with the stored event (the signature itself is not needed after verification).
KEPT_HEADERS = ("Service-Event-Id", "X-Service-Event", "X-Service-Timestamp", "User-Agent")
_MAX_ID_LENGTH = 255
# Control characters: C0 (U+0000-U+001F), DEL and C1 (U+0080-U+009F). Refused in the id and
# job id (the contract: the spec's ids are UUIDs) and in the event name too: the id and the name
# go into outgoing headers (the http sink's Service-Event-Id and X-Service-Event; AMQP and NATS
# message ids), where a CR or LF fails every delivery, the name into metric labels, all three
# into log lines; and no store keeps a NUL (see receiver.store.sqlite.intake).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Per-event-name caches (sinks that want it, metric children) stop growing at this many names:
# names come from signed payloads, so they are few, but nothing here may grow without bound.
_MAX_CACHED_NAMES = 1000

_ERROR_CODES = {
    "missing_signature": (401, "missing_signature"),
    "invalid_signature": (401, "invalid_signature"),
    "stale_timestamp": (401, "stale_timestamp"),
    "malformed": (400, "malformed_payload"),
    "too_large": (413, "payload_too_large"),
    "unavailable": (503, "unavailable"),
}


def error_response(status: int, code: str, message: str) -> web.Response:
    """The contract's error body: ``{"error": {"code", "message"}}``."""
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


def page_window(request: web.Request, default_limit: int) -> tuple[int, int] | web.Response:
    """``limit`` (1..1000) and ``offset`` (>= 0) of an admin list, or the 400 answering them."""
    try:
        limit = int(request.query.get("limit", str(default_limit)))
        offset = int(request.query.get("offset", "0"))
    except ValueError:
        return error_response(400, "invalid_request", "limit and offset must be integers")
    if not 1 <= limit <= 1000 or offset < 0:
        return error_response(400, "invalid_request", "limit must be 1..1000, offset >= 0")
    return limit, offset


# The accepted answer's bytes around the id, and its headers, made once (the id is filled in).
_ACCEPTED_HEAD = b'{"received": true, "id": '
_ACCEPTED_TAIL = {False: b', "duplicate": false}', True: b', "duplicate": true}'}
_JSON_HEADERS = CIMultiDict({"Content-Type": "application/json; charset=utf-8"})


def accepted_response(event_id: str, *, duplicate: bool) -> web.Response:
    """``{"received": true, "id": ..., "duplicate": ...}``, as json_response would write it.

    Built from bytes: this answers every accepted webhook, and json.dumps of a dict is most of
    the cost of json_response.
    """
    body = _ACCEPTED_HEAD + orjson.dumps(event_id) + _ACCEPTED_TAIL[duplicate]
    return web.Response(body=body, headers=_JSON_HEADERS)


def parse_event(body: bytes) -> dict[str, Any]:
    """The body as an event object, or PayloadError saying what is wrong.

    orjson parses strictly (RFC 8259): invalid UTF-8, lone surrogates, NaN and nesting deeper
    than 1024 levels are malformed, and it takes a quarter of the standard library's time.
    """
    try:
        event = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise PayloadError("body is not valid UTF-8 JSON") from None
    if not isinstance(event, dict):
        raise PayloadError("body is not a JSON object")
    for key in ("id", "event", "job_id"):
        value = event.get(key)
        if not isinstance(value, str) or not value:
            raise PayloadError(f"field {key!r} must be a non-empty string")
        if len(value) > _MAX_ID_LENGTH:
            raise PayloadError(f"field {key!r} is longer than {_MAX_ID_LENGTH} characters")
        # isprintable() is a third of the regex's cost and True for every UUID; a control
        # character is never printable, so only the rare other strings are searched.
        if not value.isprintable() and _CONTROL.search(value) is not None:
            raise PayloadError(f"field {key!r} holds a control character")
    if event.get("object") != "event":
        raise PayloadError("field 'object' must be \"event\"")
    return event


class ClientAddress:
    """The client's address, believing ``X-Forwarded-For`` only from trusted proxies."""

    def __init__(self, trusted: Sequence[str]) -> None:
        self._trusted = [ipaddress.ip_network(t, strict=False) for t in trusted]

    def _is_trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self._trusted)

    def __call__(self, request: web.BaseRequest) -> str:
        peer = request.remote or ""
        if not self._trusted or not self._is_trusted(peer):
            return peer
        forwarded = ",".join(request.headers.getall("X-Forwarded-For", []))
        hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
        # The rightmost address not added by one of our proxies is the real client.
        for hop in reversed(hops):
            if not self._is_trusted(hop):
                return hop
        return hops[0] if hops else peer


class Intake:
    """The webhook handler; ``on_stored`` is called after each new event is committed."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        secrets: SecretBox,
        metrics: Metrics,
        on_stored: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._store = store
        self._secrets = secrets
        self._metrics = metrics
        self._on_stored = on_stored
        self._clock = clock
        self._client_address = ClientAddress(settings.server.trusted_proxies)
        # Decided once: at other levels an accepted webhook costs no logging work at all.
        self._log_accepted = settings.log.level == "debug"
        # Counter series resolved once; each is a plain number the loop adds to
        # (receiver.observe.loop_metrics).
        self._outcomes = {o: metrics.webhook_requests.labels(o) for o in WEBHOOK_OUTCOMES}
        self._accepted = self._outcomes["accepted"]
        self._duplicate = self._outcomes["duplicate"]
        self._from_webhook = metrics.pull_events.labels("webhook")
        self._secret_matches: dict[int, Count] = {}
        #: Requests being handled now (graceful shutdown waits for them).
        self.in_flight = 0
        self._draining = False
        self._idle = asyncio.Event()
        self._by_name: dict[str, _NameInfo] = {}

    def _reject(
        self, request: web.Request, outcome: str, message: str, **fields: Any
    ) -> web.Response:
        self._outcomes[outcome].inc()
        status, code = _ERROR_CODES[outcome]
        log.warning(
            "webhook rejected",
            outcome=outcome,
            status=status,
            reason=message,
            client=self._client_address(request),
            **fields,
        )
        return error_response(status, code, message)

    async def handle(self, request: web.Request) -> web.Response:
        """POST {server.path}."""
        self.in_flight += 1
        try:
            response = await self._handle(request)
        except Exception:
            log.exception("unexpected error in the webhook handler")
            response = self._reject(request, "unavailable", "the event could not be stored")
        finally:
            self.in_flight -= 1
        if self._draining:
            response.force_close()  # the client's next request goes to the next process
            if not self.in_flight:
                self._idle.set()
        return response

    def drain(self) -> None:
        """Shutting down: answer what comes in, each with ``Connection: close``."""
        self._draining = True
        if not self.in_flight:
            self._idle.set()

    async def drained(self, timeout: float) -> bool:
        """After :meth:`drain`: wait until no request is being handled, at most ``timeout``."""
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def _handle(self, request: web.Request) -> web.Response:
        headers = request.headers
        encoding = headers.get("Content-Encoding")
        if encoding is not None and (encoding := encoding.strip().lower()) not in ("", "identity"):
            return self._reject(
                request, "malformed", f"Content-Encoding {encoding} is not accepted"
            )
        body = await self._read_body(request)
        if not isinstance(body, bytes):  # (not isinstance(body, Response): an ABC's check)
            return body

        webhook = self._settings.webhook
        now = self._clock()
        signature = headers.getall(SIGNATURE_HEADER, None)
        try:
            secret_index, timestamp = check_signature(
                self._secrets.keys,
                body,
                ",".join(signature) if signature else None,
                now,
                webhook.tolerance_seconds,
                headers.get(LEGACY_SIGNATURE_HEADER) if signature is None else None,
                webhook.allow_legacy_signature,
            )
        except SignatureError as exc:
            extra = {} if exc.skew_seconds is None else {"skew_seconds": round(exc.skew_seconds, 1)}
            return self._reject(request, exc.outcome, exc.message, **extra)

        try:
            event = parse_event(body)
            event_id = event["id"]
            header_id = headers.get("Service-Event-Id")
            if header_id is not None and header_id != event_id:
                raise PayloadError("Service-Event-Id does not match the body's id")
        except PayloadError as exc:
            return self._reject(request, "malformed", exc.message)

        name = event["event"]
        info = self._by_name.get(name) or self._name_info(name)
        new = NewEvent(
            id=event_id,
            event=name,
            job_id=event["job_id"],
            body=body,
            headers={k: v for k in KEPT_HEADERS if (v := headers.get(k)) is not None},
            received_at=now,
            sinks=info.sinks,
        )
        try:
            added = await self._store.add_event(new)
        except PayloadError as exc:  # a value no store can keep (parse_event refuses it first)
            return self._reject(request, "malformed", exc.message)
        except StoreError as exc:
            log.error("event could not be stored", event_id=event_id, error=exc.message)
            return self._reject(request, "unavailable", "the event could not be stored")
        faults.reached("after_commit")

        (self._secret_matches.get(secret_index) or self._secret_match(secret_index)).value += 1
        if timestamp is not None:
            self._metrics.signature_skew.observe(now - timestamp)
        if added:
            self._accepted.value += 1
            self._from_webhook.value += 1
            info.received.value += 1
            if self._log_accepted:
                log.debug(
                    "webhook accepted",
                    event_id=event_id,
                    job_id=new.job_id,
                    event_name=name,
                    client=self._client_address(request),
                )
            if self._on_stored is not None:
                self._on_stored()
        else:
            self._duplicate.value += 1
            info.duplicate.value += 1
            log.info("duplicate event acknowledged", event_id=event_id)
        return accepted_response(event_id, duplicate=not added)

    async def _read_body(self, request: web.Request) -> bytes | web.Response:
        """The whole body (at most ``server.max_body_bytes``), or the answer refusing it."""
        server = self._settings.server
        limit = server.max_body_bytes
        content = request.content
        try:
            if content.is_eof():  # all received already: nothing to wait for, no timer
                body = content.read_nowait()
            else:
                length = request.content_length
                if length is not None and length > limit:
                    return self._reject(request, "too_large", f"body is larger than {limit} bytes")
                async with asyncio.timeout(server.read_timeout_seconds):
                    body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._reject(request, "too_large", f"body is larger than {limit} bytes")
        except TimeoutError:
            return self._reject(request, "malformed", "body was not received in time")
        except Exception as exc:
            return self._reject(
                request, "malformed", f"body could not be read ({type(exc).__name__})"
            )
        if len(body) > limit:  # it had all arrived, whatever its Content-Length said
            return self._reject(request, "too_large", f"body is larger than {limit} bytes")
        return body

    def _name_info(self, name: str) -> _NameInfo:
        info = self._by_name.get(name)
        if info is None:
            events = self._metrics.events
            info = _NameInfo(
                sinks=self._settings.sinks_for_event(name),
                received=events.labels(name, "received"),
                duplicate=events.labels(name, "duplicate"),
            )
            if len(self._by_name) < _MAX_CACHED_NAMES:
                self._by_name[name] = info
        return info

    def _secret_match(self, index: int) -> Count:
        child = self._secret_matches.get(index)
        if child is None:
            child = self._secret_matches[index] = self._metrics.secret_matches.labels(str(index))
        return child


@dataclass(frozen=True, slots=True)
class _NameInfo:
    """What intake needs per event name: the sinks that want it, its counters."""

    sinks: tuple[str, ...]
    received: Count
    duplicate: Count
