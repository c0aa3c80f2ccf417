"""The public listener's runner: a deadline for a new connection's first request headers.

aiohttp bounds neither how long a new connection may take to send its first request's headers
nor how long it may stay silent: a client sending a few bytes and stalling (slowloris) would hold
a connection, and a file descriptor, for as long as it likes. :class:`PublicRunner` gives every
new connection ``header_timeout`` seconds to deliver complete headers, then closes it. Later
requests on a kept-alive connection are covered by aiohttp's keep-alive timeout, and request
bodies by intake's read timeout (``server.read_timeout_seconds``). Requests aiohttp cannot
parse are answered in the contract's error format (:mod:`receiver.intake.protocol_errors`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from receiver.intake.protocol_errors import answer_in_json

_END_OF_HEADERS = b"\r\n\r\n"


class HeaderDeadline(asyncio.Protocol):
    """Passes everything to aiohttp's protocol, closing the connection if the first request's
    headers are not complete ``timeout`` seconds after it opened."""

    __slots__ = ("_inner", "_tail", "_timeout", "_timer", "_transport")

    def __init__(self, inner: Any, timeout: float) -> None:
        self._inner = inner
        self._timeout = timeout
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.BaseTransport | None = None
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._timeout, self._expire)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            seen = self._tail + data
            if _END_OF_HEADERS in seen:
                self._timer.cancel()
                self._timer = None
                self._tail = b""
                # Nothing left to watch: the transport talks to aiohttp's protocol directly
                # from now on (one call less for every read of the connection).
                if self._transport is not None:
                    self._transport.set_protocol(self._inner)
            else:
                self._tail = seen[-3:]  # the end marker may straddle two reads
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        result: bool | None = self._inner.eof_received()
        return result

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def _expire(self) -> None:
        self._timer = None
        if self._transport is not None:
            self._transport.close()


class _Factory:
    """A protocol factory handing out aiohttp's protocols wrapped in :class:`HeaderDeadline`."""

    def __init__(self, server: web.Server, timeout: float) -> None:
        self._server = server
        self._timeout = timeout

    def __call__(self) -> HeaderDeadline:
        return HeaderDeadline(answer_in_json(self._server()), self._timeout)


class PublicRunner(web.AppRunner):
    """An :class:`aiohttp.web.AppRunner` whose sites give new connections ``header_timeout``
    seconds to send complete request headers."""

    def __init__(self, app: web.Application, *, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._header_timeout = header_timeout

    @property
    def server(self) -> Any:  # what sites pass to loop.create_server as the protocol factory
        inner = super().server
        return None if inner is None else _Factory(inner, self._header_timeout)
