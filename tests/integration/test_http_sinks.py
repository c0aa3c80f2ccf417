"""The ``http`` and ``slack`` sinks against real aiohttp servers playing the consumer and Slack."""

from __future__ import annotations

import json
import time

import aiohttp
import pytest

from receiver.config.load import parse_settings
from receiver.delivery.lanes import lane_result
from receiver.errors import PermanentError, TransientError
from receiver.signature import verify
from receiver.sinks.http import HttpSink
from receiver.sinks.slack import ChatSink
from tests.support.helpers import free_port
from tests.support.peers import Capture, enriched_event

SINK_SECRET = "forward-secret-0123456789"
HOOK_PATH = "/services/T0001/B0002/very-secret-token"


def sink_settings(sink: dict):
    settings = parse_settings(
        {"webhook": {"secrets": ["x"]}, "sinks": [{"name": "out", **sink}]}, env={}
    )
    return settings.sinks[0]


@pytest.fixture
async def capture(aiohttp_server):
    peer = Capture()
    server = await aiohttp_server(peer.app())
    peer.url = str(server.make_url(""))
    return peer


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s


def http_sink(capture, session, **options):
    settings = sink_settings(
        {"type": "http", "url": f"{capture.url}/hooks/in", "secret": SINK_SECRET, **options}
    )
    return HttpSink(settings, session=session)


# ----------------------------------------------------------------------------- http


async def test_http_posts_the_enriched_event_signed_like_the_upstream(capture, session):
    sink = http_sink(capture, session, headers={"Authorization": "Bearer internal"})
    event = enriched_event()
    await sink.send(event)
    [request] = capture.requests
    assert request.method == "POST" and request.path == "/hooks/in"
    assert request.body == event.to_bytes()
    assert json.loads(request.body) == event.as_json()
    headers = request.headers
    assert headers["Content-Type"] == "application/json"
    assert headers["Service-Event-Id"] == "evt_1"
    assert headers["X-Service-Event"] == "job.completed"
    assert headers["Authorization"] == "Bearer internal"
    verified = verify(
        secrets=[SINK_SECRET],
        body=request.body,
        header=headers["Service-Signature"],
        now=time.time(),
        tolerance_seconds=300,
    )
    assert verified.secret_index == 0
    with pytest.raises(Exception, match="no v1 signature matches"):
        verify(
            secrets=["another-secret"],
            body=request.body,
            header=headers["Service-Signature"],
            now=time.time(),
            tolerance_seconds=300,
        )


@pytest.mark.parametrize("status", [200, 201, 202, 204])
async def test_http_any_2xx_is_success(capture, session, status):
    capture.status = status
    await http_sink(capture, session).send(enriched_event())
    assert capture.answers == [status]


async def test_http_410_gone_is_permanent(capture, session):
    capture.status = 410
    with pytest.raises(PermanentError, match="HTTP 410"):
        await http_sink(capture, session).send(enriched_event())


@pytest.mark.parametrize("status", [400, 404, 500, 503, 302])
async def test_http_other_answers_are_failed_attempts(capture, session, status):
    capture.status = status
    with pytest.raises(TransientError, match=f"HTTP {status}") as caught:
        await http_sink(capture, session).send(enriched_event())
    assert not isinstance(caught.value, PermanentError)


async def test_http_429_retry_after_is_honoured(capture, session):
    capture.script = [(429, {"Retry-After": "17"})]
    with pytest.raises(TransientError) as caught:
        await http_sink(capture, session).send(enriched_event())
    assert caught.value.retry_after == 17


async def test_http_unreachable_is_a_failed_attempt(session):
    settings = sink_settings(
        {"type": "http", "url": f"http://127.0.0.1:{free_port()}/x?token=abc", "secret": "s"}
    )
    with pytest.raises(TransientError, match="Cannot connect") as caught:
        await HttpSink(settings, session=session).send(enriched_event())
    assert "token=abc" not in str(caught.value)


# ----------------------------------------------------------------------------- slack


def chat_sink(capture, session, **options):
    settings = sink_settings({"type": "slack", "url": f"{capture.url}{HOOK_PATH}", **options})
    return ChatSink(settings, session=session)


async def test_slack_default_message_names_event_job_and_item(capture, session):
    await chat_sink(capture, session).send(enriched_event())
    [request] = capture.requests
    assert request.path == HOOK_PATH
    assert request.headers["Content-Type"] == "application/json"
    body = json.loads(request.body)
    assert set(body) == {"text", "blocks"}
    text = body["text"]
    assert "job.completed" in text and "image_generation" in text
    assert "job_1" in text and "happy wave" in text
    assert body["blocks"][0] == {"type": "section", "text": {"type": "mrkdwn", "text": text}}
    assert "evt_1" in body["blocks"][1]["elements"][0]["text"]


async def test_slack_failure_message_carries_the_jobs_error(capture, session):
    await chat_sink(capture, session).send(enriched_event(event="job.failed"))
    text = json.loads(capture.requests[0].body)["text"]
    assert "job.failed" in text and "the provider refused the prompt" in text


async def test_slack_escapes_values_from_the_event(capture, session):
    event = enriched_event(
        job={"id": "job_1", "status": "completed", "item_name": "<!channel> & <http://x|y>"}
    )
    await chat_sink(capture, session).send(event)
    text = json.loads(capture.requests[0].body)["text"]
    assert "<!channel>" not in text
    assert "&lt;!channel&gt; &amp; &lt;http://x|y&gt;" in text


async def test_template_with_named_fields_and_asset_urls(capture, session):
    event = enriched_event(
        assets=(
            {"id": "ast_1", "type": "image", "file_url": "https://cdn.example/a.png?sig=1"},
            {"id": "ast_2", "type": "webm", "cdn_url": "https://cdn.example/b.webm"},
        )
    )
    sink = chat_sink(
        capture,
        session,
        format="generic",
        template="{event} {job_type} {job_id} {item_name} [{error}] {url_webm} {{x}}\n{asset_urls}",
    )
    await sink.send(event)
    body = json.loads(capture.requests[0].body)
    assert body["text"] == (
        "job.completed image_generation job_1 happy wave [] https://cdn.example/b.webm {x}\n"
        "image: https://cdn.example/a.png?sig=1\nwebm: https://cdn.example/b.webm"
    )
    assert body["event_id"] == "evt_1" and body["job_id"] == "job_1"
    assert body["asset_urls"]["webm"] == "https://cdn.example/b.webm"


async def test_discord_and_teams_shapes(capture, session):
    await chat_sink(capture, session, format="discord").send(enriched_event(event="job.failed"))
    await chat_sink(capture, session, format="teams").send(enriched_event())
    discord, teams = (json.loads(r.body) for r in capture.requests)
    assert set(discord) >= {"content", "embeds"}
    assert discord["allowed_mentions"] == {"parse": []}
    assert "job.failed" in discord["content"]
    facts = {f["name"]: f["value"] for f in discord["embeds"][0]["fields"]}
    assert facts["Error"] == "the provider refused the prompt"
    assert teams["@type"] == "MessageCard" and "job_1" in teams["text"]
    assert {"name": "Item", "value": "happy wave"} in teams["sections"][0]["facts"]


async def test_slack_never_waits_inside_send(capture, session):
    """Pacing is the lane's (it claims one message per token): send posts at once."""
    sink = chat_sink(capture, session)
    assert sink.settings.rate_limit_per_second == 1.0
    started = time.monotonic()
    for n in range(3):
        await sink.send(enriched_event(event_id=f"evt_{n}"))
    assert len(capture.requests) == 3
    assert time.monotonic() - started < 1.0


async def test_slack_429_retry_after_pauses_the_lane(capture, session):
    sink = chat_sink(capture, session)
    capture.script = [(429, {"Retry-After": "40"})]
    with pytest.raises(TransientError) as caught:
        await sink.send(enriched_event())
    assert (caught.value.retry_after, caught.value.status) == (40, 429)
    assert lane_result(caught.value) == ("neutral", 40)


@pytest.mark.parametrize(
    "status,error", [(404, PermanentError), (410, PermanentError), (500, TransientError)]
)
async def test_slack_errors_never_show_the_hook_path(capture, session, status, error):
    capture.status = status
    with pytest.raises(error) as caught:
        await chat_sink(capture, session).send(enriched_event())
    assert f"HTTP {status}" in str(caught.value)
    assert "very-secret-token" not in str(caught.value)
    assert (status >= 500) == (not isinstance(caught.value, PermanentError))


# ------------------------------------------------------------- http: outbound formats

WHSEC = "whsec_" + "c2luay1zZWNyZXQtZm9yLXN0YW5kYXJkLXdlYmhvb2tz"  # 33 bytes


@pytest.mark.parametrize("mode", ["structured", "binary"])
async def test_http_cloudevents_signed_with_standard_webhooks(capture, session, mode):
    """The official libraries judge: the SDK parses the request, Standard Webhooks verifies it;
    a tampered body fails."""
    from standardwebhooks import Webhook
    from standardwebhooks.webhooks import WebhookVerificationError

    from tests.support.outbound import assert_is_the_event, from_http

    sink = http_sink(
        capture,
        session,
        secret=WHSEC,
        signing="standard-webhooks",
        envelope="cloudevents",
        cloudevents_mode=mode,
        cloudevents_source="https://receiver.example/events",
        headers={"Authorization": "Bearer internal"},
    )
    event = enriched_event()
    await sink.send(event)
    [request] = capture.requests
    headers = request.headers
    assert headers["webhook-id"] == "evt_1"
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60
    assert headers["Authorization"] == "Bearer internal"
    assert "Service-Signature" not in headers
    Webhook(WHSEC).verify(request.body, headers)
    assert_is_the_event(
        from_http(headers, request.body), event, source="https://receiver.example/events"
    )
    if mode == "structured":
        assert headers["Content-Type"] == "application/cloudevents+json"
    else:
        assert headers["Content-Type"] == "application/json"
        assert request.body == event.to_bytes()
    with pytest.raises(WebhookVerificationError):
        Webhook(WHSEC).verify(request.body.replace(b"happy wave", b"happy wavE"), headers)


async def test_http_cloudevents_keeps_the_service_signature_by_default(capture, session):
    from tests.support.outbound import assert_is_the_event, from_http

    await http_sink(capture, session, envelope="cloudevents").send(enriched_event())
    [request] = capture.requests
    assert request.headers["Content-Type"] == "application/cloudevents+json"
    assert request.headers["Service-Event-Id"] == "evt_1"
    signature, now = request.headers["Service-Signature"], time.time()
    verify(secrets=[SINK_SECRET], body=request.body, header=signature, now=now, tolerance_seconds=9)
    assert_is_the_event(from_http(request.headers, request.body), enriched_event())


async def test_http_standard_webhooks_with_the_receiver_envelope(capture, session):
    from standardwebhooks import Webhook

    await http_sink(capture, session, secret=WHSEC, signing="standard-webhooks").send(
        enriched_event()
    )
    [request] = capture.requests
    assert request.body == enriched_event().to_bytes()
    assert request.headers["Content-Type"] == "application/json"
    assert Webhook(WHSEC).verify(request.body, request.headers) == enriched_event().as_json()


def test_http_headers_may_not_replace_the_standard_webhooks_ones():
    from receiver.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        sink_settings(
            {
                "type": "http",
                "url": "https://consumer.example/in",
                "secret": WHSEC,
                "signing": "standard-webhooks",
                "headers": {"Webhook-Signature": "v1,forged"},
            }
        )
    assert err.value.problems == ["sinks.out.headers.Webhook-Signature: is set by the sink itself"]
