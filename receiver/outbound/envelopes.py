"""How the enriched event is dressed on the way out: the one place every sink asks.

``envelope = "receiver"`` (the default) is the enriched event JSON as it always was, byte for
byte. ``envelope = "cloudevents"`` is a CloudEvents 1.0 event: ``id`` = the upstream event id
(consumers deduplicate on it), ``type`` = the event name, ``source`` = the sink's
``cloudevents_source`` (default ``receiver``), ``subject`` = the job id (left out when there is
none), ``time`` = when the webhook was received, ``datacontenttype`` = ``application/json`` and
``data`` = the enriched event.

Each protocol binding of the spec has two content modes, chosen by ``cloudevents_mode`` on the
sinks whose binding offers both (http, amqp, nats):

- *structured* (the default): the JSON event format, ``{"specversion": "1.0", ..., "data":
  <enriched event>}``, with the media type ``application/cloudevents+json`` (http:
  ``Content-Type``; amqp: the ``content_type`` property; nats: a ``Content-Type`` header). Redis
  (the ``data`` field) and exec (stdin) always carry this form.
- *binary*: the enriched event as the body, the attributes beside it: http ``ce-<name>``
  headers and ``Content-Type: application/json``; amqp ``cloudEvents_<name>`` application
  properties (message headers, values as their canonical strings; the ``_`` separator the
  AMQP binding prefers, for JMS clients) and the ``content_type`` property; nats ``ce-<name>``
  headers, ``ce-datacontenttype`` included, as the NATS binding maps every attribute to a
  header. Header values are
  percent-encoded as the HTTP and NATS bindings prescribe.

With tracing on, the delivery attempt's W3C ``traceparent`` also travels as the CloudEvents
distributed-tracing extension attribute ``traceparent`` (beside each sink's own header, field or
variable for it).

The format is written here rather than with the CloudEvents SDK: it is a handful of lines, the
structured form embeds the enriched event's cached bytes unchanged, and the receiver gains no
runtime dependency. The SDK is the judge in the tests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from receiver.events import Enriched, iso_time

RECEIVER = "receiver"
CLOUDEVENTS = "cloudevents"
ENVELOPES = (RECEIVER, CLOUDEVENTS)
STRUCTURED = "structured"
BINARY = "binary"
MODES = (STRUCTURED, BINARY)
DEFAULT_SOURCE = "receiver"
SPECVERSION = "1.0"
JSON_TYPE = "application/json"
CLOUDEVENTS_JSON_TYPE = "application/cloudevents+json"
AMQP_PREFIX = "cloudEvents_"
HEADER_PREFIX = "ce-"
#: The W3C trace context header (and the CloudEvents distributed-tracing extension attribute).
TRACEPARENT = "traceparent"

# Characters a header value keeps as they are: printable ASCII but space, '"' and '%'.
_HEADER_SAFE = frozenset(chr(c) for c in range(0x21, 0x7F)) - {'"', "%"}


def percent_encode(value: str) -> str:
    """A header value as the CloudEvents HTTP and NATS bindings encode it."""
    if _HEADER_SAFE.issuperset(value):
        return value
    return "".join(
        c if c in _HEADER_SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in value
    )


@dataclass(frozen=True)
class Message:
    """An event dressed for a sink: the body, its media type, and in binary mode the attributes
    the binding carries beside the body (``datacontenttype`` is ``content_type``)."""

    body: bytes
    content_type: str
    attributes: Mapping[str, str] = field(default_factory=dict)
    cloudevent: bool = False


class Envelope:
    """One sink's envelope, from its options ``envelope``, ``cloudevents_source`` and
    ``cloudevents_mode`` (checked by the config loader)."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.kind = str(options.get("envelope") or RECEIVER)
        self.source = str(options.get("cloudevents_source") or DEFAULT_SOURCE)
        self.mode = str(options.get("cloudevents_mode") or STRUCTURED)
        self.cloudevents = self.kind == CLOUDEVENTS

    def attributes(self, enriched: Enriched) -> dict[str, str]:
        """The event's CloudEvents context attributes, ``datacontenttype`` last."""
        attributes = {
            "specversion": SPECVERSION,
            "id": enriched.event_id,
            "source": self.source,
            "type": enriched.event_name,
        }
        if enriched.job_id:
            attributes["subject"] = enriched.job_id
        attributes["time"] = iso_time(enriched.received_at)
        if enriched.traceparent is not None:  # the distributed-tracing extension
            attributes[TRACEPARENT] = enriched.traceparent
        attributes["datacontenttype"] = JSON_TYPE
        return attributes

    def structured(self, enriched: Enriched) -> bytes:
        """The body a redis or exec sink carries: the enriched event, or the CloudEvent in the
        JSON event format whose ``data`` is the enriched event's exact bytes."""
        data = enriched.to_bytes()
        if not self.cloudevents:
            return data
        head = json.dumps(self.attributes(enriched), separators=(",", ":"), ensure_ascii=False)
        return head[:-1].encode() + b',"data":' + data + b"}"

    def message(self, enriched: Enriched) -> Message:
        """The body, media type and (binary mode) attributes in this envelope."""
        if not self.cloudevents:
            return Message(enriched.to_bytes(), JSON_TYPE)
        if self.mode == BINARY:
            attributes = self.attributes(enriched)
            content_type = attributes.pop("datacontenttype")
            return Message(enriched.to_bytes(), content_type, attributes, cloudevent=True)
        return Message(self.structured(enriched), CLOUDEVENTS_JSON_TYPE, cloudevent=True)

    def http(self, enriched: Enriched) -> tuple[bytes, dict[str, str]]:
        """Body and headers for an HTTP request (HTTP binding)."""
        message = self.message(enriched)
        headers = {"Content-Type": message.content_type}
        headers.update(_ce_headers(message.attributes))
        return message.body, headers

    def nats(self, enriched: Enriched) -> tuple[bytes, dict[str, str]]:
        """Payload and headers for a NATS message (NATS binding); no header for ``receiver``."""
        message = self.message(enriched)
        if not message.cloudevent:
            return message.body, {}
        if self.mode == BINARY:
            attributes = {**message.attributes, "datacontenttype": message.content_type}
            return message.body, _ce_headers(attributes)
        return message.body, {"Content-Type": message.content_type}

    def amqp(self, enriched: Enriched) -> tuple[bytes, str, dict[str, str]]:
        """Body, ``content_type`` property and application properties (AMQP binding)."""
        message = self.message(enriched)
        properties = {AMQP_PREFIX + name: value for name, value in message.attributes.items()}
        return message.body, message.content_type, properties


def trace_headers(enriched: Enriched) -> dict[str, str]:
    """The W3C ``traceparent`` header of the delivery attempt (tracing on), else none."""
    return {} if enriched.traceparent is None else {TRACEPARENT: enriched.traceparent}


def _ce_headers(attributes: Mapping[str, str]) -> dict[str, str]:
    return {HEADER_PREFIX + name: percent_encode(value) for name, value in attributes.items()}
