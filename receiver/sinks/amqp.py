"""The ``amqp`` sink: each event published to RabbitMQ (or any AMQP 0-9-1 broker) with aio-pika.

Messages are persistent (delivery mode 2), JSON, with ``message_id`` = the event id (so a
consumer can drop redeliveries), ``type`` = the event name and the headers ``event``,
``job_id`` and ``job_type``. The channel uses publisher confirms: a delivery counts only once the
broker has confirmed the message; a nack, a lost connection or no confirm within the sink's
``timeout_seconds`` is a failed attempt. With ``mandatory = true`` (the default) a message no
queue is bound to receive is returned by the broker and also counts as a failed attempt, instead
of vanishing.

``exchange`` (declared durable, of ``exchange_type``) is the default exchange when empty;
``routing_key`` may name ``{event}`` and ``{job_type}`` and defaults to the ``queue`` on the
default exchange, else to ``{event}``. ``queue``, when set, is declared durable at connect time
and, on a named exchange, bound with ``binding_key``. The connection is made on first use and
made again after any failure, so a broker restart heals by itself.

With ``envelope = "cloudevents"`` the message follows the CloudEvents AMQP binding
(:mod:`receiver.outbound.envelopes`): structured, the body is the CloudEvent JSON with
``content_type`` ``application/cloudevents+json``; binary, the body stays the enriched event and
the attributes ride as ``cloudEvents_*`` headers. The properties and headers above stay.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange
from aio_pika.exceptions import CONNECTION_EXCEPTIONS, PublishError
from aio_pika.exceptions import DeliveryError as Nacked

from receiver.config.settings import SinkSettings
from receiver.errors import TransientError
from receiver.events import Enriched
from receiver.logs import get_logger, redact_url
from receiver.outbound.envelopes import Envelope, trace_headers
from receiver.outbound.template import render, routing_fields
from receiver.sinks.base import SinkContext

log = get_logger(__name__)


class AmqpSink:
    """Publishes each event with publisher confirms. Options: ``url``, ``exchange``,
    ``exchange_type``, ``routing_key``, ``queue``, ``binding_key``, ``mandatory``, ``envelope``,
    ``cloudevents_source``, ``cloudevents_mode``."""

    def __init__(self, settings: SinkSettings) -> None:
        options = settings.options
        self.name = settings.name
        self.settings = settings
        self.exchange_name = str(options.get("exchange") or "")
        self.exchange_type = str(options.get("exchange_type") or "topic")
        self.queue: str | None = options.get("queue")
        self.binding_key = str(options.get("binding_key") or "#")
        self.mandatory = bool(options.get("mandatory", True))
        routing_key = options.get("routing_key")
        if routing_key is None:
            routing_key = self.queue if not self.exchange_name and self.queue else "{event}"
        self.routing_key = str(routing_key)
        self._envelope = Envelope(options)
        self._url = str(options["url"])
        self._shown_url = redact_url(self._url)
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None
        self._lock = asyncio.Lock()

    def _error(self, exc: BaseException) -> str:
        text = str(exc).replace(self._url, self._shown_url)
        return f"amqp {self._shown_url}: {type(exc).__name__}" + (f": {text}" if text else "")

    async def _ready(self) -> AbstractExchange:
        """The exchange to publish to, connecting (and declaring) first when needed."""
        async with self._lock:
            if (
                self._exchange is not None
                and self._channel is not None
                and not self._channel.is_closed
            ):
                return self._exchange
            await self._disconnect()
            timeout = self.settings.timeout_seconds
            connection = await aio_pika.connect(
                self._url,
                timeout=timeout,
                client_properties={"connection_name": f"receiver sink {self.name}"},
            )
            try:
                channel = await connection.channel(
                    publisher_confirms=True, on_return_raises=self.mandatory
                )
                if self.exchange_name:
                    exchange = await channel.declare_exchange(
                        self.exchange_name, self.exchange_type, durable=True, timeout=timeout
                    )
                else:
                    exchange = channel.default_exchange
                if self.queue:
                    queue = await channel.declare_queue(self.queue, durable=True, timeout=timeout)
                    if self.exchange_name:
                        await queue.bind(exchange, self.binding_key, timeout=timeout)
            except BaseException:
                with contextlib.suppress(*CONNECTION_EXCEPTIONS, asyncio.CancelledError):
                    await connection.close()
                raise
            self._connection, self._channel, self._exchange = connection, channel, exchange
            return exchange

    async def _disconnect(self) -> None:
        connection = self._connection
        self._connection = self._channel = self._exchange = None
        if connection is not None and not connection.is_closed:
            with contextlib.suppress(*CONNECTION_EXCEPTIONS):
                await connection.close()

    async def open(self) -> None:
        """Connect and declare; a broker that is down is only logged (deliveries retry)."""
        try:
            await self._ready()
        except (*CONNECTION_EXCEPTIONS, TimeoutError) as exc:
            log.warning(
                "amqp broker is not reachable yet; deliveries will retry",
                sink=self.name,
                error=self._error(exc),
            )

    async def close(self) -> None:
        """Close the connection."""
        async with self._lock:
            await self._disconnect()

    def message(self, enriched: Enriched) -> aio_pika.Message:
        """The persistent message for an event."""
        body, content_type, properties = self._envelope.amqp(enriched)
        headers: dict[str, Any] = {
            "event": enriched.event_name,
            "job_id": enriched.job_id,
            "job_type": enriched.job_type or "",
            **properties,
            **trace_headers(enriched),
        }
        return aio_pika.Message(
            body,
            content_type=content_type,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=enriched.event_id,
            type=enriched.event_name,
            app_id="receiver",
            headers=headers,
        )

    async def send(self, enriched: Enriched) -> None:
        """Publish and wait for the broker's confirm; raise TransientError otherwise."""
        routing_key = render(self.routing_key, routing_fields(enriched))
        try:
            exchange = await self._ready()
            await exchange.publish(
                self.message(enriched),
                routing_key=routing_key,
                mandatory=self.mandatory,
                timeout=self.settings.timeout_seconds,
            )
        except PublishError:
            raise TransientError(
                f"amqp: the broker returned the message: no queue is bound to exchange "
                f"{self.exchange_name or '(default)'!r} for routing key {routing_key!r}"
            ) from None
        except Nacked as exc:
            raise TransientError(f"amqp: the broker refused the message ({exc})") from None
        except (*CONNECTION_EXCEPTIONS, TimeoutError) as exc:
            async with self._lock:
                await self._disconnect()
            raise TransientError(self._error(exc)) from None


def create(settings: SinkSettings, context: SinkContext) -> AmqpSink:
    return AmqpSink(settings)
