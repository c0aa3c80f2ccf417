"""The ``http`` sink: the enriched event POSTed to an internal service, signed.

With ``signing = "service"`` (the default) the request carries the same headers the upstream
sends with its webhooks (:func:`receiver.signature.webhook_headers`), keyed with the sink's own
``secret``: ``Service-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">``,
``Service-Event-Id`` (the event id, for deduplication), ``X-Service-Event`` and
``X-Service-Timestamp``. A consumer verifies it with the same code the receiver uses
(:func:`receiver.signature.verify`). With ``signing = "standard-webhooks"`` it carries
``webhook-id`` (the event id), ``webhook-timestamp`` and ``webhook-signature``, keyed with a
``whsec_<base64>`` secret, for any Standard Webhooks library. The body and its content headers
follow the sink's ``envelope`` (:mod:`receiver.outbound.envelopes`).

Any 2xx is success; 410 Gone marks the delivery dead at once (the consumer says it will never
take it); every other answer, a network error or the sink's ``timeout_seconds`` running out is a
failed attempt, retried with backoff (``Retry-After`` honoured on 429 and 503).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import aiohttp

from receiver.config.settings import SinkSettings
from receiver.events import Enriched
from receiver.logs import redact_url
from receiver.outbound.envelopes import Envelope, trace_headers
from receiver.signature import SERVICE_SCHEME, Signer
from receiver.sinks.base import SinkContext
from receiver.sinks.posting import post

GONE = 410


class HttpSink:
    """POSTs each enriched event, signed, to ``url``. Options: ``url``, ``secret``, ``headers``,
    ``signing``, ``envelope``, ``cloudevents_source``, ``cloudevents_mode``."""

    def __init__(
        self,
        settings: SinkSettings,
        *,
        session: aiohttp.ClientSession,
        clock: Callable[[], float] = time.time,
    ) -> None:
        options = settings.options
        self.name = settings.name
        self.settings = settings
        self.url = str(options["url"])
        self._signer = Signer(str(options.get("signing") or SERVICE_SCHEME), str(options["secret"]))
        self._envelope = Envelope(options)
        self._extra_headers = {str(k): str(v) for k, v in (options.get("headers") or {}).items()}
        self._shown_url = redact_url(self.url)
        self._session = session
        self._clock = clock

    async def open(self) -> None:
        """Nothing to open: requests use the process's shared HTTP session."""

    async def close(self) -> None:
        """Nothing to close."""

    async def send(self, enriched: Enriched) -> int:
        """POST the event; raise a DeliveryError unless the answer is a 2xx."""
        body, content_headers = self._envelope.http(enriched)
        headers = {
            **self._extra_headers,
            **self._signer.headers(
                body,
                int(self._clock()),
                event_id=enriched.event_id,
                event_name=enriched.event_name,
            ),
            **content_headers,
            **trace_headers(enriched),
        }
        return await post(
            self._session,
            self.url,
            body,
            headers,
            shown_url=self._shown_url,
            is_permanent=lambda status: status == GONE,
        )


def create(settings: SinkSettings, context: SinkContext) -> HttpSink:
    return HttpSink(settings, session=context.session)
