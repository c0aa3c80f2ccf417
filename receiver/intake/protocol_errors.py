"""What the public listener refuses before the webhook handler, in the contract's error format.

A request aiohttp cannot parse (a broken ``Content-Length`` or chunk size, a duplicated
``Content-Type``, a control character in a header, headers over 8 KiB) never reaches the
webhook handler or its middlewares: aiohttp's protocol answers it itself, in plain text. On the
public listener every error is ``{"error": {"code", "message"}}``, so :func:`answer_in_json`
turns aiohttp's protocol for one connection into :class:`JsonErrorProtocol`, which answers the
same status (and still logs the one line aiohttp logs) with that body: 413
``payload_too_large``, any other 4xx ``malformed_payload``, a 5xx ``unavailable``.

Requests the router has no handler for get the same body through :func:`refusal_routes`, which
are matched only when nothing else is (no cost to a webhook): a path served for another method
is 405 ``method_not_allowed`` (with ``Allow``), any other path 404 ``not_found``.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from receiver.intake.endpoint import error_response

# The reason aiohttp gives is the client's own bytes at most: shown, but kept short.
MAX_MESSAGE_CHARS = 200


def error_code(status: int) -> str:
    """The contract's error code for a request refused with ``status`` before its handler."""
    if status == 413:
        return "payload_too_large"
    return "malformed_payload" if status < 500 else "unavailable"


class JsonErrorProtocol(RequestHandler):
    """aiohttp's protocol, answering the requests it cannot parse with the contract's body."""

    __slots__ = ()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> StreamResponse:
        # aiohttp's own: logs the one line, and raises if an answer was already under way.
        super().handle_error(request, status, exc, message)
        reason = " ".join((message or (str(exc) if exc else "") or "bad request").split())
        response = error_response(status, error_code(status), reason[:MAX_MESSAGE_CHARS])
        response.force_close()
        return response


def refusal_routes(served: dict[str, str]) -> list[web.RouteDef]:
    """Routes answering what the public listener does not serve, to be added after its own:
    every method but the served one on each path of ``served`` (path: method), then any path."""

    def wrong_method(path: str, allowed: str) -> web.RouteDef:
        async def refuse(request: web.Request) -> web.Response:
            response = error_response(
                405, "method_not_allowed", f"{path} takes {allowed}, not {request.method}"
            )
            response.headers["Allow"] = allowed
            return response

        return web.route("*", path, refuse)

    async def not_found(request: web.Request) -> web.Response:
        return error_response(404, "not_found", "nothing is served at this path")

    routes = [wrong_method(path, method) for path, method in served.items()]
    return [*routes, web.route("*", "/{tail:.*}", not_found)]


def answer_in_json(protocol: RequestHandler) -> RequestHandler:
    """``protocol``, answering unparseable requests in JSON from now on (the same object: the
    subclass adds behaviour only, no state)."""
    protocol.__class__ = JsonErrorProtocol
    return protocol
