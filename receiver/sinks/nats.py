"""The ``nats`` sink: each event published to NATS JetStream with nats-py.

Every message carries ``Nats-Msg-Id`` = the event id, so the stream's duplicate window drops a
redelivery (the acknowledgement then says ``duplicate``, and the delivery still counts as done).
A delivery counts only once JetStream has acknowledged the message: no stream for the subject,
no acknowledgement within the sink's ``timeout_seconds``, or a lost connection is a failed
attempt.

``subject`` may name ``{event}`` and ``{job_type}``. With ``stream`` set, the publish tells
JetStream which stream must store the message (a subject captured by another stream is an
error). ``create_stream = true`` creates that stream on first connect if it is missing, with
``stream_subjects`` (default: the subject, or ``prefix.>`` for ``prefix.{event}``) and
``duplicate_window_seconds``; an existing stream is left as it is.

The connection is made on first use and made again, on the next attempt, after it was lost,
so a NATS restart heals by itself while the worker's backoff paces the attempts.

With ``envelope = "cloudevents"`` the message follows the CloudEvents NATS binding
(:mod:`receiver.outbound.envelopes`): structured, the payload is the CloudEvent JSON with a
``Content-Type: application/cloudevents+json`` header; binary, the payload stays the enriched
event and every attribute rides as a ``ce-*`` header.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext

from receiver.config.settings import SinkSettings
from receiver.config.sink_checks import default_stream_subjects
from receiver.errors import TransientError
from receiver.events import Enriched
from receiver.logs import get_logger, redact_url
from receiver.outbound.envelopes import Envelope, trace_headers
from receiver.outbound.template import render, routing_fields
from receiver.sinks.base import SinkContext

log = get_logger(__name__)

MSG_ID_HEADER = "Nats-Msg-Id"


class NatsSink:
    """Publishes each event to JetStream. Options: ``url``, ``subject``, ``stream``,
    ``create_stream``, ``stream_subjects``, ``duplicate_window_seconds``, ``envelope``,
    ``cloudevents_source``, ``cloudevents_mode``."""

    def __init__(self, settings: SinkSettings) -> None:
        options = settings.options
        self.name = settings.name
        self.settings = settings
        self.subject = str(options["subject"])
        self.stream: str | None = options.get("stream")
        self.create_stream = bool(options.get("create_stream", False))
        self.stream_subjects = list(
            options.get("stream_subjects") or default_stream_subjects(self.subject)
        )
        self.duplicate_window = float(options.get("duplicate_window_seconds", 3600.0))
        self._envelope = Envelope(options)
        self._url = str(options["url"])
        self._shown_url = redact_url(self._url)
        self._client: Client | None = None
        self._js: JetStreamContext | None = None
        self._stream_ready = False
        self._lost = asyncio.Event()  # set when the current connection goes away
        self._lock = asyncio.Lock()

    def _error(self, exc: BaseException) -> str:
        text = str(exc).replace(self._url, self._shown_url)
        return f"nats {self._shown_url}: {type(exc).__name__}" + (f": {text}" if text else "")

    async def _on_error(self, exc: Exception) -> None:
        log.warning("nats connection error", sink=self.name, error=self._error(exc))

    async def _ready(self) -> JetStreamContext:
        async with self._lock:
            client = self._client
            if client is not None and client.is_connected and self._js is not None:
                return self._js
            await self._disconnect()
            timeout = self.settings.timeout_seconds
            # Each connection has its own "lost" flag, so a late callback of an old connection
            # cannot mark a newer one lost.
            lost = asyncio.Event()

            async def on_lost() -> None:
                if not lost.is_set():
                    lost.set()
                    log.warning("nats connection lost; the next attempt reconnects", sink=self.name)

            # No reconnection inside the client: a lost connection fails the attempt at once
            # and the next attempt connects anew, paced by the worker's backoff. (nats-py
            # tries a server max_reconnect_attempts + 1 times even for the first connect, and
            # 0 would mean forever.)
            client = await nats.connect(
                self._url,
                name=f"receiver sink {self.name}",
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0,
                connect_timeout=max(1, int(min(timeout, 10.0))),
                error_cb=self._on_error,
                disconnected_cb=on_lost,
                closed_cb=on_lost,
            )
            js = client.jetstream(timeout=timeout)
            try:
                if self.create_stream and not self._stream_ready:
                    await self._ensure_stream(js)
            except BaseException:
                with contextlib.suppress(Exception):
                    await client.close()
                raise
            self._client, self._js, self._lost = client, js, lost
            return js

    async def _ensure_stream(self, js: JetStreamContext) -> None:
        assert self.stream is not None
        try:
            await js.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            try:
                await js.add_stream(
                    name=self.stream,
                    subjects=self.stream_subjects,
                    duplicate_window=self.duplicate_window,
                )
            except nats.js.errors.APIError as exc:
                raise TransientError(
                    f"nats: stream {self.stream} could not be created: {exc}"
                ) from None
            log.info(
                "jetstream stream created",
                sink=self.name,
                stream=self.stream,
                subjects=self.stream_subjects,
                duplicate_window_seconds=self.duplicate_window,
            )
        self._stream_ready = True

    async def _disconnect(self) -> None:
        self._lost.set()  # closing it ourselves: nothing to warn about
        client, self._client, self._js = self._client, None, None
        if client is not None and not client.is_closed:
            with contextlib.suppress(Exception):
                await client.close()

    async def open(self) -> None:
        """Connect (creating the stream if configured); a NATS that is down is only logged."""
        try:
            await self._ready()
        except TransientError as exc:
            log.warning(
                "nats is not ready yet; deliveries will retry", sink=self.name, error=exc.message
            )
        except (nats.errors.Error, OSError) as exc:
            log.warning(
                "nats is not reachable yet; deliveries will retry",
                sink=self.name,
                error=self._error(exc),
            )

    async def close(self) -> None:
        """Close the connection."""
        async with self._lock:
            await self._disconnect()

    async def _unless_lost(self, request: Coroutine[Any, Any, Any]) -> Any:
        """Await ``request``, failing at once if the connection is lost meanwhile (nats-py
        would otherwise leave the request waiting for its whole timeout)."""
        lost = self._lost
        task = asyncio.ensure_future(request)
        watch = asyncio.ensure_future(lost.wait())
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise nats.errors.ConnectionClosedError
        return task.result()

    async def send(self, enriched: Enriched) -> None:
        """Publish and wait for JetStream's acknowledgement."""
        subject = render(self.subject, routing_fields(enriched))
        timeout = self.settings.timeout_seconds
        payload, headers = self._envelope.nats(enriched)
        try:
            js = await self._ready()
            ack: Any = await self._unless_lost(
                js.publish(
                    subject,
                    payload,
                    timeout=timeout,
                    stream=self.stream,
                    headers={
                        MSG_ID_HEADER: enriched.event_id,
                        **headers,
                        **trace_headers(enriched),
                    },
                )
            )
        except nats.js.errors.NoStreamResponseError:
            raise TransientError(
                f"nats: no JetStream stream stores subject {subject!r}"
                + ("" if self.create_stream else " (create one, or set create_stream = true)")
            ) from None
        except nats.js.errors.APIError as exc:
            raise TransientError(f"nats: JetStream refused the message: {exc}") from None
        except nats.errors.TimeoutError:
            raise TransientError(
                f"nats: no acknowledgement for subject {subject!r} within {timeout:g} s"
            ) from None
        except (nats.errors.Error, OSError) as exc:
            async with self._lock:
                await self._disconnect()
            raise TransientError(self._error(exc)) from None
        if ack.duplicate:
            log.info(
                "jetstream dropped a redelivery as a duplicate",
                sink=self.name,
                stream=ack.stream,
                seq=ack.seq,
            )


def create(settings: SinkSettings, context: SinkContext) -> NatsSink:
    return NatsSink(settings)
