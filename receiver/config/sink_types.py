"""What each sink type is called, where it lives and which keys its config table takes.

This module imports nothing heavy: config validation uses it without loading any broker library.
A sink module is imported only when a config names its type
(see :func:`receiver.sinks.loader.build_sinks`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from receiver.config import sink_checks as checks
from receiver.outbound.envelopes import ENVELOPES, MODES
from receiver.signature import SCHEMES


@dataclass(frozen=True)
class Option:
    """One key of a sink's config table."""

    kind: type | tuple[type, ...]
    required: bool = False
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] = ()
    item_kind: type | None = None  # element type when ``kind`` is list


@dataclass(frozen=True)
class SinkType:
    """A sink type: the module implementing it, the extra it needs, and its own keys."""

    module: str
    options: dict[str, Option] = field(default_factory=dict)
    extra: str | None = None  # pip extra, e.g. "redis"
    import_name: str | None = None  # the library the extra provides
    # Checks across keys and of values (URL schemes, templates); see receiver.config.sink_checks.
    check: Callable[[Mapping[str, Any]], list[str]] | None = None
    # The lane's rate_limit_per_second when the config gives none (0 = unlimited).
    default_rate: float = 0.0


# Keys every [[sinks]] table may carry, whatever its type.
COMMON_KEYS: dict[str, Option] = {
    "name": Option(str, required=True, help="unique name of this sink"),
    "type": Option(str, required=True, help="sink type"),
    "events": Option(list, item_kind=str, default=(), help="event names; default all"),
    "job_types": Option(list, item_kind=str, default=(), help="upstream job types; default all"),
    "max_attempts": Option(int, help="attempts before dead; default [worker].max_attempts"),
    "concurrency": Option(int, help="deliveries in flight; default [worker].concurrency"),
    "rate_limit_per_second": Option(
        float, help="this lane's sends per second; 0 = no limit; default by type"
    ),
    "timeout_seconds": Option((int, float), default=60.0, help="limit for one delivery"),
}

# Keys of every sink that carries the enriched event (see receiver.outbound.envelopes).
ENVELOPE_KEYS: dict[str, Option] = {
    "envelope": Option(
        str, choices=ENVELOPES, help="receiver (the enriched event JSON; default) or cloudevents"
    ),
    "cloudevents_source": Option(str, help='the CloudEvents source; default "receiver"'),
}
# Keys of the sinks whose CloudEvents binding has both content modes.
MODE_KEYS: dict[str, Option] = {
    **ENVELOPE_KEYS,
    "cloudevents_mode": Option(str, choices=MODES, help="structured (default) or binary"),
}

SINK_TYPES: dict[str, SinkType] = {
    "download": SinkType(
        module="receiver.sinks.download",
        options={
            "directory": Option(str, default="data/downloads", help="where files are written"),
            "allow_private_networks": Option(
                bool, default=False, help="allow file URLs on private/loopback addresses"
            ),
            "max_file_bytes": Option(int, default=1024 * 1024 * 1024, help="largest file"),
        },
    ),
    "redis": SinkType(
        module="receiver.sinks.redis",
        extra="redis",
        import_name="redis",
        check=checks.check_redis,
        options={
            "url": Option(str, required=True, help="redis://host:port/db (rediss:// for TLS)"),
            "stream": Option(str, required=True, help="stream key the events are added to"),
            "maxlen": Option(int, help="approximate cap on the stream's length (MAXLEN ~)"),
            "dedup_seconds": Option(
                int, help="how long an event id is remembered; default: [store].retention_hours"
            ),
            **ENVELOPE_KEYS,
        },
    ),
    "amqp": SinkType(
        module="receiver.sinks.amqp",
        extra="amqp",
        import_name="aio_pika",
        check=checks.check_amqp,
        options={
            "url": Option(str, required=True, help="amqp://user:password@host:5672/vhost"),
            "exchange": Option(str, default="", help='exchange; "" is the default exchange'),
            "exchange_type": Option(
                str, default="topic", choices=("direct", "fanout", "topic", "headers")
            ),
            "routing_key": Option(str, help="default: the queue (default exchange), else {event}"),
            "queue": Option(str, help="a durable queue declared (and bound) at start"),
            "binding_key": Option(str, default="#", help="binds the queue to the exchange"),
            "mandatory": Option(bool, default=True, help="an unroutable message is a failure"),
            **MODE_KEYS,
        },
    ),
    "nats": SinkType(
        module="receiver.sinks.nats",
        extra="nats",
        import_name="nats",
        check=checks.check_nats,
        options={
            "url": Option(str, required=True, help="nats://host:4222"),
            "subject": Option(str, required=True, help="may name {event} and {job_type}"),
            "stream": Option(str, help="the stream expected to store the messages"),
            "create_stream": Option(bool, default=False, help="create the stream if missing"),
            "stream_subjects": Option(list, item_kind=str, help="subjects of a created stream"),
            "duplicate_window_seconds": Option(
                float, default=3600.0, help="a created stream's duplicate window"
            ),
            **MODE_KEYS,
        },
    ),
    "slack": SinkType(
        module="receiver.sinks.slack",
        check=checks.check_chat,
        options={
            "url": Option(str, required=True, help="the incoming-webhook URL (a secret)"),
            "format": Option(
                str, default="slack", choices=("slack", "discord", "teams", "generic")
            ),
            "template": Option(str, help="message text with {fields}; default names the job"),
        },
        default_rate=1.0,  # Slack's documented rate for incoming webhooks
    ),
    "http": SinkType(
        module="receiver.sinks.http",
        check=checks.check_http,
        options={
            "url": Option(str, required=True, help="where the enriched event is POSTed"),
            "secret": Option(str, required=True, help="signs each request (see signing)"),
            "headers": Option(dict, help="extra request headers"),
            "signing": Option(
                str,
                choices=SCHEMES,
                help="service (Service-Signature; default) or standard-webhooks",
            ),
            **MODE_KEYS,
        },
    ),
    "exec": SinkType(
        module="receiver.sinks.exec",
        check=checks.check_exec,
        options={
            "command": Option(list, required=True, item_kind=str, help="argv, never a shell"),
            "env": Option(dict, help="extra environment variables"),
            "cwd": Option(str, help="working directory"),
            **ENVELOPE_KEYS,
        },
    ),
}
