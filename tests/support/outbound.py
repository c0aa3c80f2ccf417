"""Reading what the sinks send with the official CloudEvents SDK, one function per binding.

The SDK has HTTP and AMQP bindings; for NATS, which it lacks, :func:`from_nats` follows the
NATS binding's text (structured when ``Content-Type`` starts with ``application/cloudevents``,
else binary: every attribute in a percent-encoded ``ce-`` header) and lets the SDK's JSON format
and event class do the parsing and the validation.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from cloudevents.core.bindings import amqp, http
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from receiver.events import Enriched


def from_http(headers: Mapping[str, str], body: bytes) -> Any:
    return http.from_http_event(http.HTTPMessage(dict(headers), body))


def from_amqp(content_type: str | None, headers: Mapping[str, Any], body: bytes) -> Any:
    """An AMQP 0-9-1 message: its headers table holds the binding's application properties."""
    message = amqp.AMQPMessage(
        properties={"content-type": content_type} if content_type else {},
        application_properties=dict(headers),
        application_data=body,
    )
    return amqp.from_amqp_event(message)


def from_nats(headers: Mapping[str, str] | None, payload: bytes) -> Any:
    headers = {k.lower(): v for k, v in (headers or {}).items()}
    json_format = JSONFormat()
    if headers.get("content-type", "").lower().startswith("application/cloudevents"):
        return json_format.read(None, payload)
    attributes: dict[str, Any] = {
        name[3:]: unquote(value, errors="strict")
        for name, value in headers.items()
        if name.startswith("ce-")
    }
    if "time" in attributes:
        attributes["time"] = datetime.fromisoformat(attributes["time"])
    data = json_format.read_data(payload, attributes.get("datacontenttype"))
    return CloudEvent(attributes, data)


def assert_is_the_event(event: Any, enriched: Enriched, *, source: str = "receiver") -> None:
    """The CloudEvent the contract asks for: the enriched event's ids, names, time and data."""
    assert event.get_specversion() == "1.0"
    assert event.get_id() == enriched.event_id
    assert event.get_type() == enriched.event_name
    assert event.get_source() == source
    assert event.get_subject() == enriched.job_id
    assert event.get_time() == datetime.fromtimestamp(enriched.received_at, UTC)
    assert event.get_datacontenttype() == "application/json"
    assert event.get_data() == enriched.as_json()
