"""Envelopes and signing schemes, judged by the official libraries (CloudEvents SDK, Standard
Webhooks), and the config checks of their keys."""

from __future__ import annotations

import base64
import json
import time

import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from receiver.config.load import parse_settings
from receiver.errors import ConfigError
from receiver.events import Enriched
from receiver.outbound.envelopes import Envelope, percent_encode
from receiver.signature import (
    Signer,
    new_standard_webhooks_secret,
    standard_webhooks_key,
    webhook_headers,
)
from tests.support.outbound import assert_is_the_event, from_amqp, from_http, from_nats
from tests.support.peers import enriched_event

SECRET = new_standard_webhooks_secret()
CE = {"envelope": "cloudevents"}


def test_the_receiver_envelope_is_the_enriched_event_unchanged() -> None:
    event = enriched_event()
    envelope = Envelope({})
    assert envelope.structured(event) is event.to_bytes()
    assert envelope.http(event) == (event.to_bytes(), {"Content-Type": "application/json"})
    assert envelope.nats(event) == (event.to_bytes(), {})
    assert envelope.amqp(event) == (event.to_bytes(), "application/json", {})
    assert Envelope({"envelope": "receiver"}).http(event) == envelope.http(event)


@pytest.mark.parametrize("mode", ["structured", "binary"])
def test_http_in_both_modes_parses_with_the_sdk(mode: str) -> None:
    event = enriched_event()
    body, headers = Envelope({**CE, "cloudevents_mode": mode}).http(event)
    assert_is_the_event(from_http(headers, body), event)
    if mode == "structured":
        assert headers == {"Content-Type": "application/cloudevents+json"}
        # data is the enriched event's own bytes, not a re-serialisation
        assert body.endswith(b',"data":' + event.to_bytes() + b"}")
    else:
        assert body == event.to_bytes()
        assert headers["Content-Type"] == "application/json"
        assert headers["ce-id"] == "evt_1" and headers["ce-subject"] == "job_1"


@pytest.mark.parametrize("mode", ["structured", "binary"])
def test_amqp_and_nats_bindings_parse(mode: str) -> None:
    event = enriched_event()
    envelope = Envelope({**CE, "cloudevents_mode": mode, "cloudevents_source": "urn:receiver"})
    body, content_type, properties = envelope.amqp(event)
    assert_is_the_event(from_amqp(content_type, properties, body), event, source="urn:receiver")
    payload, headers = envelope.nats(event)
    assert_is_the_event(from_nats(headers, payload), event, source="urn:receiver")
    if mode == "binary":
        assert set(properties) == {f"cloudEvents_{a}" for a in ("specversion", "id", "source")} | {
            f"cloudEvents_{a}" for a in ("type", "subject", "time")
        }
        assert headers["ce-datacontenttype"] == "application/json"


def test_redis_and_exec_carry_the_structured_form() -> None:
    event = enriched_event()
    data = Envelope(CE).structured(event)
    parsed = json.loads(data)
    assert list(parsed) == [
        "specversion",
        "id",
        "source",
        "type",
        "subject",
        "time",
        "datacontenttype",
        "data",
    ]
    assert parsed["time"] == "2026-01-01T00:00:00.000Z"
    assert_is_the_event(from_http({"Content-Type": "application/cloudevents+json"}, data), event)


def test_no_job_id_means_no_subject() -> None:
    event = Enriched("evt_9", "job.failed", {"id": "evt_9"}, {}, (), (), 1.0, 2.0)
    body, headers = Envelope({**CE, "cloudevents_mode": "binary"}).http(event)
    assert "ce-subject" not in headers
    assert from_http(headers, body).get_subject() is None
    assert "subject" not in json.loads(Envelope(CE).structured(event))


def test_header_values_are_percent_encoded_and_the_sdk_reads_them_back() -> None:
    source = 'tenant "a" 100% → ünïcode'
    assert percent_encode("plain/urn:x") == "plain/urn:x"
    encoded = percent_encode(source)
    assert encoded.isascii() and " " not in encoded and '"' not in encoded
    event = enriched_event()
    envelope = Envelope({**CE, "cloudevents_mode": "binary", "cloudevents_source": source})
    body, headers = envelope.http(event)
    assert from_http(headers, body).get_source() == source
    payload, nats_headers = envelope.nats(event)
    assert from_nats(nats_headers, payload).get_source() == source


# ------------------------------------------------------------------------ Standard Webhooks


def test_standard_webhooks_signature_verifies_with_the_official_library() -> None:
    body = enriched_event().to_bytes()
    now = int(time.time())
    headers = Signer("standard-webhooks", SECRET).headers(
        body, now, event_id="evt_1", event_name="job.completed"
    )
    assert headers["webhook-id"] == "evt_1"
    assert headers["webhook-timestamp"] == str(now)
    assert headers["webhook-signature"].startswith("v1,")
    assert Webhook(SECRET).verify(body, headers) == json.loads(body)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body.replace(b"happy", b"HAPPY"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_standard_webhooks_secret()).verify(body, headers)


def test_without_an_event_id_standard_webhooks_makes_a_fresh_one() -> None:
    signer = Signer("standard-webhooks", SECRET)
    first = signer.headers(b"[]", 1, event_id=None, event_name=None)["webhook-id"]
    second = signer.headers(b"[]", 1, event_id=None, event_name=None)["webhook-id"]
    assert first.startswith("msg_") and first != second


def test_the_service_scheme_is_todays_headers() -> None:
    body = b'{"id":"evt_1"}'
    assert Signer("service", "s3cret").headers(
        body, 100, event_id="evt_1", event_name="job.completed"
    ) == webhook_headers("s3cret", body, 100, event_id="evt_1", event_name="job.completed")


def test_a_secret_without_padding_is_the_same_key_the_library_uses() -> None:
    raw = bytes(range(25))  # 25 bytes: base64 with padding "=="
    padded = "whsec_" + base64.b64encode(raw).decode()
    assert padded.endswith("==")
    assert standard_webhooks_key(padded) == standard_webhooks_key(padded.rstrip("=")) == raw
    assert Webhook(padded.rstrip("="))._whsecret == raw


@pytest.mark.parametrize(
    ("secret", "why"),
    [
        ("plain-secret", "does not start with whsec_"),
        ("whsec_", "nothing follows whsec_"),
        ("whsec_abc-def_ghi", "is not standard base64"),
        ("whsec_abcde", "is not standard base64"),
        ("whsec_a b", "is not standard base64"),
    ],
)
def test_malformed_standard_webhooks_secrets(secret: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        standard_webhooks_key(secret)
    with pytest.raises(ValueError, match=why):
        Signer("standard-webhooks", secret)


# ------------------------------------------------------------------------ config checks


def problems(*sinks: dict) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_settings({"webhook": {"secrets": ["x"]}, "sinks": list(sinks)}, env={})
    return err.value.problems


HTTP = {"type": "http", "url": "https://consumer.example/in", "secret": "s"}
REDIS = {"type": "redis", "url": "redis://127.0.0.1:6379/0", "stream": "s"}


def test_every_new_key_loads_when_right() -> None:
    settings = parse_settings(
        {
            "webhook": {"secrets": ["x"]},
            "sinks": [
                {
                    "name": "h",
                    **HTTP,
                    "secret": SECRET,
                    "signing": "standard-webhooks",
                    "envelope": "cloudevents",
                    "cloudevents_mode": "binary",
                    "cloudevents_source": "https://receiver.example/events",
                },
                {"name": "r", **REDIS, "envelope": "cloudevents"},
                {"name": "e", "type": "exec", "command": ["cat"], "envelope": "receiver"},
            ],
        },
        env={},
    )
    assert settings.sinks[0].options["signing"] == "standard-webhooks"
    assert settings.sinks[1].options["envelope"] == "cloudevents"


def test_bad_values_are_errors_naming_the_key() -> None:
    found = problems(
        {"name": "a", **HTTP, "envelope": "cloudevent"},
        {"name": "b", **HTTP, "envelope": "cloudevents", "cloudevents_mode": "batch"},
        {"name": "c", **HTTP, "signing": "hmac"},
        {"name": "d", **HTTP, "signing": "standard-webhooks", "secret": "not-whsec"},
        {"name": "e", **HTTP, "signing": "standard-webhooks", "secret": "whsec_a-b_c"},
        {"name": "f", **REDIS, "cloudevents_source": "x"},
        {"name": "g", **REDIS, "envelope": "cloudevents", "cloudevents_source": "has space"},
    )
    assert found == [
        "sinks.a.envelope: must be one of receiver, cloudevents",
        "sinks.b.cloudevents_mode: must be one of structured, binary",
        "sinks.c.signing: must be one of service, standard-webhooks",
        "sinks.d.secret: must be whsec_<base64> for Standard Webhooks "
        '(it does not start with whsec_) (signing = "standard-webhooks")',
        "sinks.e.secret: must be whsec_<base64> for Standard Webhooks "
        '(what follows whsec_ is not standard base64) (signing = "standard-webhooks")',
        'sinks.f.cloudevents_source: applies only with envelope = "cloudevents"',
        "sinks.g.cloudevents_source: must be a URI-reference without spaces "
        '(e.g. "receiver" or "https://receiver.example/events")',
    ]


def test_keys_on_sinks_that_do_not_take_them_are_errors() -> None:
    slack = {"type": "slack", "url": "https://hooks.slack.com/services/T/B/X"}
    found = problems(
        {"name": "files", "type": "download", "envelope": "cloudevents"},
        {"name": "chat", **slack, "envelope": "cloudevents"},
        {"name": "stream", **REDIS, "signing": "standard-webhooks"},
        {"name": "stream2", **REDIS, "envelope": "cloudevents", "cloudevents_mode": "binary"},
        {"name": "h", **HTTP, "cloudevents_mode": "binary"},
        {"type": "download", "envelope": "cloudevents"},
    )
    carriers = "redis, amqp, nats, http, exec"
    assert found == [
        f"sinks.files.envelope: not a key of download sinks (only {carriers} sinks take it)",
        f"sinks.chat.envelope: not a key of slack sinks (only {carriers} sinks take it)",
        "sinks.stream.signing: not a key of redis sinks (only http sinks take it)",
        "sinks.stream2.cloudevents_mode: not a key of redis sinks "
        "(only amqp, nats, http sinks take it)",
        'sinks.h.cloudevents_mode: applies only with envelope = "cloudevents"',
        f"sinks[5].envelope: not a key of download sinks (only {carriers} sinks take it)",
        "sinks[5].name: missing",
    ]
