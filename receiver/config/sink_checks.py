"""Checks of a sink table's values beyond their types: URL schemes, templates, names.

Each check takes the table's values (defaults filled in) and returns problems as
``"<key>: <what is wrong>"``; the config loader prefixes them with ``sinks.<name>.``. Pure: no
broker library is imported here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from receiver.outbound.envelopes import CLOUDEVENTS
from receiver.outbound.template import (
    MESSAGE_FIELDS,
    ROUTING_FIELDS,
    field_names,
    template_problems,
)
from receiver.signature import STANDARD_WEBHOOKS_SCHEME, standard_webhooks_key

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# JetStream stream names: no whitespace, dots, wildcards or path separators.
_STREAM_NAME = re.compile(r"[^\s.*>/\\]+")
_NATS_SUBJECT = re.compile(r"[^\s]+")
#: Headers the http sink computes itself; configured ``headers`` may not replace them.
SIGNED_HEADERS = frozenset(
    {
        "content-type",
        "service-signature",
        "service-event-id",
        "x-service-signature",
        "x-service-timestamp",
        "x-service-event",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    }
)


def url_problems(url: str, schemes: tuple[str, ...], example: str) -> list[str]:
    """A URL must parse and use one of ``schemes``; ``example`` shows the expected form."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        return [f"url: is not a valid URL ({exc})"]
    if parts.scheme not in schemes:
        names = [f"{s}://" for s in schemes]
        allowed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        return [f"url: must start with {allowed} (e.g. {example})"]
    if parts.scheme != "unix" and not parts.hostname:
        return [f"url: has no host (e.g. {example})"]
    return []


def _strings_table(key: str, table: Any, name_pattern: re.Pattern[str], what: str) -> list[str]:
    problems = []
    for name, value in (table or {}).items():
        if not name_pattern.fullmatch(name):
            problems.append(f"{key}.{name}: is not a valid {what}")
        if not isinstance(value, str):
            problems.append(f"{key}.{name}: must be a string")
    return problems


def _routing_template(key: str, value: str) -> list[str]:
    return [f"{key}: {p}" for p in template_problems(value, ROUTING_FIELDS)]


def check_redis(values: Mapping[str, Any]) -> list[str]:
    problems = url_problems(values["url"], ("redis", "rediss", "unix"), "redis://127.0.0.1:6379/0")
    if not values["stream"]:
        problems.append("stream: must not be empty")
    if values.get("maxlen") is not None and values["maxlen"] < 1:
        problems.append("maxlen: must be at least 1")
    if values.get("dedup_seconds") is not None and values["dedup_seconds"] < 0:
        problems.append("dedup_seconds: must be 0 (off) or more")
    return problems


def check_amqp(values: Mapping[str, Any]) -> list[str]:
    problems = url_problems(values["url"], ("amqp", "amqps"), "amqp://guest:guest@127.0.0.1:5672/")
    routing_key = values.get("routing_key")
    if routing_key is not None:
        problems += _routing_template("routing_key", routing_key)
    if not values["exchange"] and not values.get("queue") and not routing_key:
        problems.append(
            "exchange: publishing to the default exchange needs a queue or a routing_key"
        )
    return problems


def check_nats(values: Mapping[str, Any]) -> list[str]:
    problems = url_problems(values["url"], ("nats", "tls", "ws", "wss"), "nats://127.0.0.1:4222")
    subject = values["subject"]
    if not _NATS_SUBJECT.fullmatch(subject) or "*" in subject or ">" in subject:
        problems.append("subject: must be a subject without spaces or wildcards")
    problems += _routing_template("subject", subject)
    stream = values.get("stream")
    if stream is not None and not _STREAM_NAME.fullmatch(stream):
        problems.append("stream: must be a name without spaces, dots, wildcards or slashes")
    if values["create_stream"]:
        if not stream:
            problems.append("create_stream: needs a stream name (stream = ...)")
        if not values.get("stream_subjects") and not default_stream_subjects(subject):
            problems.append(
                "stream_subjects: needed when create_stream is true and the subject starts "
                "with a {field}"
            )
    if values["duplicate_window_seconds"] <= 0:
        problems.append("duplicate_window_seconds: must be positive")
    return problems


def default_stream_subjects(subject: str) -> list[str]:
    """The subjects a created stream captures: the subject itself, or, when it names fields,
    everything under its fixed prefix (``receiver.{event}`` -> ``receiver.>``)."""
    try:
        if not field_names(subject):
            return [subject]
    except ValueError:
        return []
    prefix = subject.split("{", 1)[0]
    if not prefix.endswith(".") or prefix == ".":
        return []
    return [f"{prefix}>"]


def check_chat(values: Mapping[str, Any]) -> list[str]:
    problems = url_problems(
        values["url"], ("http", "https"), "https://hooks.slack.com/services/T000/B000/XXXX"
    )
    template = values.get("template")
    if template is not None:
        if not template.strip():
            problems.append("template: must not be empty")
        problems += [
            f"template: {p}" for p in template_problems(template, MESSAGE_FIELDS, url_fields=True)
        ]
    return problems


def check_http(values: Mapping[str, Any]) -> list[str]:
    problems = url_problems(
        values["url"], ("http", "https"), "https://events.internal.example/hooks/receiver"
    )
    if not values["secret"]:
        problems.append("secret: must not be empty")
    elif values.get("signing") == STANDARD_WEBHOOKS_SCHEME:
        try:
            standard_webhooks_key(values["secret"])
        except ValueError as exc:
            problems.append(f'secret: {exc} (signing = "{STANDARD_WEBHOOKS_SCHEME}")')
    headers = values.get("headers") or {}
    problems += _strings_table("headers", headers, _HEADER_NAME, "header name")
    problems += [
        f"headers.{name}: is set by the sink itself"
        for name in headers
        if name.lower() in SIGNED_HEADERS
    ]
    return problems


def check_exec(values: Mapping[str, Any]) -> list[str]:
    problems = []
    command = values["command"]
    if not command or not command[0]:
        problems.append('command: must name a program, e.g. ["/usr/local/bin/on-event", "--x"]')
    problems += _strings_table("env", values.get("env"), _ENV_NAME, "variable name")
    if values.get("cwd") == "":
        problems.append("cwd: must not be empty")
    return problems


def check_envelope(values: Mapping[str, Any]) -> list[str]:
    """The envelope keys of a sink that carries the enriched event (``envelope`` is valid)."""
    problems = []
    if values.get("envelope") != CLOUDEVENTS:
        problems += [
            f'{key}: applies only with envelope = "{CLOUDEVENTS}"'
            for key in ("cloudevents_source", "cloudevents_mode")
            if values.get(key) is not None
        ]
    source = values.get("cloudevents_source")
    if source is not None and (
        not source or any(c.isspace() or not c.isprintable() for c in source)
    ):
        problems.append(
            "cloudevents_source: must be a URI-reference without spaces "
            '(e.g. "receiver" or "https://receiver.example/events")'
        )
    return problems
