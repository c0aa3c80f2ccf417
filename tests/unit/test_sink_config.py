"""Sink tables: each type's keys, defaults and the problems check-config reports, by sink name."""

from __future__ import annotations

import pytest

from receiver.config.load import parse_settings
from receiver.config.sink_checks import default_stream_subjects
from receiver.errors import ConfigError
from receiver.outbound.template import field_names, render, template_problems
from receiver.sinks.exec import child_environment, command_limit
from tests.support.peers import enriched_event

MINIMAL_SINKS = [
    {"name": "r", "type": "redis", "url": "redis://127.0.0.1:6379/0", "stream": "events"},
    {"name": "a", "type": "amqp", "url": "amqp://guest:guest@127.0.0.1:5672/", "queue": "q"},
    {"name": "n", "type": "nats", "url": "nats://127.0.0.1:4222", "subject": "receiver.events"},
    {"name": "s", "type": "slack", "url": "https://hooks.slack.com/services/T/B/X"},
    {"name": "h", "type": "http", "url": "https://events.internal/in", "secret": "s3cret"},
    {"name": "e", "type": "exec", "command": ["/usr/local/bin/on-event"]},
]


def parse(sinks):
    return parse_settings({"webhook": {"secrets": ["x"]}, "sinks": sinks}, env={})


def problems(sinks):
    with pytest.raises(ConfigError) as caught:
        parse(sinks)
    return caught.value.problems


def test_every_type_with_its_minimal_keys_and_defaults():
    sinks = {s.name: s for s in parse(MINIMAL_SINKS).sinks}
    assert sinks["r"].options == {"url": "redis://127.0.0.1:6379/0", "stream": "events"}
    assert sinks["a"].options["exchange"] == "" and sinks["a"].options["mandatory"] is True
    assert sinks["a"].options["exchange_type"] == "topic"
    assert sinks["n"].options["create_stream"] is False
    assert sinks["n"].options["duplicate_window_seconds"] == 3600.0
    assert sinks["s"].options["format"] == "slack"
    # Each lane's pace: the slack family at Slack's 1 message/s, the others unlimited.
    assert sinks["s"].rate_limit_per_second == 1.0
    assert {s.rate_limit_per_second for n, s in sinks.items() if n != "s"} == {0.0}
    assert sinks["h"].options["secret"] == "s3cret"
    assert sinks["e"].options["command"] == ("/usr/local/bin/on-event",)
    assert all(s.max_attempts is None and s.concurrency is None for s in sinks.values())


@pytest.mark.parametrize(
    "sink,expected",
    [
        ({"type": "redis", "stream": "x"}, "sinks.bad.url: missing"),
        (
            {"type": "redis", "url": "redis://h", "stream": "x", "colour": 1},
            "sinks.bad.colour: not a key of redis sinks",
        ),
        ({"type": "redis", "url": "redis://h", "stream": 5}, "sinks.bad.stream: must be a string"),
        (
            {"type": "redis", "url": "http://h", "stream": "x"},
            "sinks.bad.url: must start with redis://, rediss:// or unix://",
        ),
        (
            {"type": "redis", "url": "redis://h", "stream": "x", "maxlen": 0},
            "sinks.bad.maxlen: must be at least 1",
        ),
        (
            {"type": "amqp", "url": "amqp://h"},
            "sinks.bad.exchange: publishing to the default exchange needs a queue or a routing_key",
        ),
        (
            {"type": "amqp", "url": "amqp://h", "exchange": "x", "exchange_type": "round-robin"},
            "sinks.bad.exchange_type: must be one of direct, fanout, topic, headers",
        ),
        (
            {"type": "amqp", "url": "amqp://h", "exchange": "x", "routing_key": "{item_name}"},
            "sinks.bad.routing_key: {item_name} is not a known field",
        ),
        (
            {"type": "nats", "url": "nats://h", "subject": "a.>"},
            "sinks.bad.subject: must be a subject without spaces or wildcards",
        ),
        (
            {"type": "nats", "url": "nats://h", "subject": "a", "create_stream": True},
            "sinks.bad.create_stream: needs a stream name",
        ),
        (
            {
                "type": "nats",
                "url": "nats://h",
                "subject": "{event}",
                "stream": "S",
                "create_stream": True,
            },
            "sinks.bad.stream_subjects: needed when create_stream",
        ),
        (
            {"type": "nats", "url": "nats://h", "subject": "a", "stream": "a.b"},
            "sinks.bad.stream: must be a name without spaces, dots",
        ),
        ({"type": "slack"}, "sinks.bad.url: missing"),
        ({"type": "slack", "url": "hooks.slack.com/x"}, "sinks.bad.url: must start with http://"),
        (
            {"type": "slack", "url": "https://h", "format": "irc"},
            "sinks.bad.format: must be one of slack, discord, teams, generic",
        ),
        (
            {"type": "slack", "url": "https://h", "template": "{job.id}"},
            "sinks.bad.template: {job.id} is not a known field",
        ),
        (
            {"type": "slack", "url": "https://h", "template": "{job_id!r}"},
            "sinks.bad.template: {job_id...}: conversions and format specs are not supported",
        ),
        (
            {"type": "slack", "url": "https://h", "template": "oops {"},
            "sinks.bad.template: is not a valid template",
        ),
        (
            {"type": "slack", "url": "https://h", "rate_limit_per_second": "fast"},
            "sinks.bad.rate_limit_per_second: must be a number",
        ),
        (
            {"type": "http", "url": "https://h", "secret": "s", "rate_limit_per_second": -1},
            "sinks.bad.rate_limit_per_second: must be 0 (no limit) or more",
        ),
        ({"type": "http", "url": "https://h"}, "sinks.bad.secret: missing"),
        ({"type": "http", "url": "https://h", "secret": ""}, "sinks.bad.secret: must not be empty"),
        (
            {
                "type": "http",
                "url": "https://h",
                "secret": "s",
                "headers": {"Service-Signature": "x"},
            },
            "sinks.bad.headers.Service-Signature: is set by the sink itself",
        ),
        (
            {"type": "http", "url": "https://h", "secret": "s", "headers": {"X-Team": 7}},
            "sinks.bad.headers.X-Team: must be a string",
        ),
        (
            {"type": "http", "url": "https://h", "secret": "s", "timeout_seconds": 0},
            "sinks.bad.timeout_seconds: must be positive",
        ),
        ({"type": "exec", "command": "notify-send hello"}, "sinks.bad.command: must be a list"),
        ({"type": "exec", "command": []}, "sinks.bad.command: must name a program"),
        ({"type": "exec", "command": ["x", 1]}, "sinks.bad.command: every entry must be a string"),
        (
            {"type": "exec", "command": ["x"], "env": {"A-B": "1"}},
            "sinks.bad.env.A-B: is not a valid variable name",
        ),
        (
            {"type": "exec", "command": ["x"], "concurrency": 0},
            "sinks.bad.concurrency: must be at least 1",
        ),
    ],
)
def test_problems_name_the_sink_and_the_key(sink, expected):
    found = problems([{"name": "bad", **sink}])
    assert any(p.startswith(expected) for p in found), found


def test_every_problem_of_several_sinks_is_reported():
    found = problems(
        [
            {"name": "one", "type": "redis", "url": "http://h", "stream": "x"},
            {"name": "two", "type": "http", "url": "ftp://h", "secret": "s"},
            {"name": "three", "type": "exec", "command": []},
        ]
    )
    assert [p.split(":", 1)[0] for p in found] == [
        "sinks.one.url",
        "sinks.two.url",
        "sinks.three.command",
    ]


def test_template_fields():
    event = enriched_event(
        assets=({"id": "a1", "type": "image", "file_url": "https://f/a1.png?sig=x"},)
    )
    from receiver.outbound.template import event_fields

    fields = event_fields(event)
    assert render("{event} {job_id} {url_image} {url_video} {{}}", fields) == (
        "job.completed job_1 https://f/a1.png?sig=x  {}"
    )
    assert render("<{item_name}>", fields, str.upper) == "<HAPPY WAVE>"
    assert field_names("a {x} {{y}} {z}") == ["x", "z"]
    assert template_problems("{url_image} {asset_urls}", ["asset_urls"], url_fields=True) == []
    assert template_problems("{url_}", ["asset_urls"], url_fields=True)
    assert template_problems("{url_image}", ["asset_urls"])


@pytest.mark.parametrize(
    "subject,expected",
    [
        ("receiver.events", ["receiver.events"]),
        ("receiver.{event}", ["receiver.>"]),
        ("receiver.{job_type}.{event}", ["receiver.>"]),
        ("{event}", []),
        ("receiver-{event}", []),
    ],
)
def test_default_stream_subjects(subject, expected):
    assert default_stream_subjects(subject) == expected


def test_exec_environment_and_limit():
    env = child_environment(
        {"PATH": "/bin", "RECEIVER_API_KEY": "k", "RECEIVER_WEBHOOK_SECRETS": "s"},
        {"EXTRA": "1"},
        enriched_event(),
    )
    assert env == {
        "PATH": "/bin",
        "EXTRA": "1",
        "RECEIVER_EVENT_ID": "evt_1",
        "RECEIVER_EVENT": "job.completed",
        "RECEIVER_JOB_ID": "job_1",
        "RECEIVER_JOB_TYPE": "image_generation",
    }
    assert command_limit(60) == 59
    assert command_limit(2) == pytest.approx(1.8)


def test_config_example_documents_every_sink_type_and_key():
    """The commented sink tables in config.example.toml, uncommented, are a valid config that
    uses every type and every key the registry knows."""
    import re
    import tomllib

    from receiver.config.sink_types import SINK_TYPES
    from tests.support.helpers import ROOT

    text = (ROOT / "config.example.toml").read_text()
    uncommented = [
        line[2:] for line in text.splitlines() if re.match(r"# (\[\[sinks\]\]$|[a-z_]+ = )", line)
    ]
    document = tomllib.loads(text)
    document["sinks"] += tomllib.loads("\n".join(uncommented))["sinks"]
    settings = parse_settings(document, env={})
    used: dict[str, set[str]] = {}
    for table in document["sinks"]:
        used.setdefault(table["type"], set()).update(table)
    assert set(used) == set(SINK_TYPES)
    for sink_type, spec in SINK_TYPES.items():
        assert set(spec.options) <= used[sink_type], sink_type
    assert len(settings.sinks) == len(document["sinks"])


def test_default_chat_text():
    from receiver.outbound.template import event_fields
    from receiver.sinks.slack import default_text

    one = enriched_event(assets=({"id": "a1", "type": "logo", "file_url": "https://f/a1"},))
    assert default_text(event_fields(one)) == (
        "✅ job.completed: image_generation job job_1 for “happy wave” (1 asset)"
    )
    failed = event_fields(enriched_event(event="job.failed"))
    assert default_text(failed) == (
        "❌ job.failed: image_generation job job_1 for “happy wave” failed: "
        "the provider refused the prompt"
    )


def test_each_sink_module_is_named_after_its_type():
    """One place to look for a type's code: ``type = "redis"`` lives in receiver/sinks/redis.py."""
    import importlib

    from receiver.config.sink_types import SINK_TYPES

    for name, sink_type in SINK_TYPES.items():
        assert sink_type.module == f"receiver.sinks.{name}"
        module = importlib.import_module(sink_type.module)
        assert module.__file__ is not None and module.__file__.endswith(f"sinks/{name}.py")
