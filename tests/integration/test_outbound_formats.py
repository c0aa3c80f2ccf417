"""docs/consumers.md, run: its Python consumer takes what the http sink sends, its curl does what
the sink does, its broker readers read what the envelopes build; and the command line around the
formats (``sign``/``replay --scheme``, ``init``, ``check-config``)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from standardwebhooks import Webhook

from receiver.cli import main
from receiver.config.load import load_settings
from receiver.outbound.envelopes import Envelope
from receiver.signature import new_standard_webhooks_secret
from receiver.sinks.http import HttpSink
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import ROOT, write_config
from tests.support.outbound import assert_is_the_event
from tests.support.peers import enriched_event
from tests.support.services import require_tool
from tests.support.sinks import sink_settings

DOC = ROOT / "docs" / "consumers.md"
SECRET = new_standard_webhooks_secret()
SOURCE = "https://receiver.example/events"


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC.read_text(), re.S | re.M)


def run_block(code: str, **names: Any) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "docs_consumers", **names}
    exec(compile(code, str(DOC), "exec"), namespace)
    return namespace


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[Any, ...]:
    """``receiver ARGS`` in this process: (exit code, stdout, stderr)."""
    return (main(list(args)), *capsys.readouterr())


@pytest.fixture
async def consumer(aiohttp_server, monkeypatch):
    """The documented aiohttp consumer, served; ``seen`` holds each request's headers."""
    monkeypatch.setenv("RECEIVER_SINK_SECRET", SECRET)
    example = run_block(blocks("python")[0])
    seen: list[dict[str, str]] = []

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        seen.append(dict(request.headers))
        return await handler(request)

    example["app"].middlewares.append(record)
    server = await aiohttp_server(example["app"])
    return SimpleNamespace(
        url=str(server.make_url("/hooks/receiver")), done=example["done"], seen=seen
    )


@pytest.mark.parametrize("mode", ["structured", "binary"])
async def test_the_documented_consumer_takes_what_the_http_sink_sends(consumer, capsys, mode):
    settings = sink_settings(
        "billing",
        "http",
        url=consumer.url,
        secret=SECRET,
        signing="standard-webhooks",
        envelope="cloudevents",
        cloudevents_mode=mode,
        cloudevents_source=SOURCE,
    )
    async with aiohttp.ClientSession() as session:
        sink = HttpSink(settings, session=session)
        await sink.send(enriched_event())  # raises unless the consumer answered 2xx
        await sink.send(enriched_event())  # a redelivery: handled once
        # The same signed headers on another body: refused.
        forged = {k: v for k, v in consumer.seen[0].items() if k.startswith(("ce-", "webhook-"))}
        async with session.post(consumer.url, data=b'{"forged":true}', headers=forged) as response:
            assert response.status == 401
    assert consumer.done == {"evt_1"}
    assert capsys.readouterr().out == "job.completed job_1 []\n"
    if mode == "binary":
        # The page's binary request shows the headers the sink sends.
        documented = re.findall(r"^([A-Za-z-]+): ", blocks("text")[0], re.M)
        sent = [name for name in consumer.seen[0] if name.startswith(("ce-", "webhook-"))]
        assert sorted(documented) == sorted(["Content-Type", *sent])


async def test_the_documented_curl_is_what_the_sink_sends(consumer, tmp_path):
    bash = require_tool("bash")
    require_tool("curl", installed_by="make deploy-tools")
    require_tool("openssl", installed_by="apt-get install openssl")
    [script] = blocks("sh")
    (tmp_path / "event.json").write_bytes(
        Envelope({"envelope": "cloudevents"}).structured(enriched_event(event_id="evt_curl"))
    )
    proc = await asyncio.create_subprocess_exec(
        bash,
        "-euc",
        script,
        cwd=tmp_path,
        env={**os.environ, "SECRET": SECRET, "URL": consumer.url},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, out + err
    assert consumer.done == {"evt_curl"}
    assert consumer.seen[0]["Content-Type"] == "application/cloudevents+json"


@pytest.mark.parametrize("mode", ["structured", "binary"])
def test_the_documented_readers_read_every_binding(mode):
    readers = run_block(blocks("python")[1])
    event = enriched_event()
    envelope = Envelope({"envelope": "cloudevents", "cloudevents_mode": mode})
    structured = Envelope({"envelope": "cloudevents"}).structured(event)
    body, content_type, properties = envelope.amqp(event)
    amqp_message = SimpleNamespace(
        content_type=content_type, headers={"event": "job.completed", **properties}, body=body
    )
    payload, headers = envelope.nats(event)
    nats_message = SimpleNamespace(headers={"Nats-Msg-Id": "evt_1", **headers}, data=payload)
    for cloudevent in (
        readers["from_redis"]({b"event_id": b"evt_1", b"data": structured}),
        readers["from_exec"](structured),
        readers["from_amqp"](amqp_message),
        readers["from_nats"](nats_message),
    ):
        assert_is_the_event(cloudevent, event)


# ------------------------------------------------------------------------ the command line


def test_sign_with_standard_webhooks(capsys, tmp_path):
    payload = ROOT / "examples" / "job-failed.json"
    code, out, err = cli(
        capsys, "sign", "--scheme", "standard-webhooks", "--secret", SECRET, str(payload)
    )
    assert code == 0, err
    headers = dict(line.split(": ", 1) for line in out.splitlines())
    assert headers["webhook-id"] == json.loads(payload.read_bytes())["id"]
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60
    assert Webhook(SECRET).verify(payload.read_bytes(), headers)

    anonymous = tmp_path / "no-id.json"
    anonymous.write_text('{"event": "job.completed"}')
    code, out, _ = cli(
        capsys, "sign", "--scheme", "standard-webhooks", "--secret", SECRET, str(anonymous)
    )
    headers = dict(line.split(": ", 1) for line in out.splitlines())
    assert code == 0 and headers["webhook-id"].startswith("msg_")
    Webhook(SECRET).verify(anonymous.read_bytes(), headers)

    code, out, _ = cli(
        capsys,
        "sign",
        "--scheme",
        "standard-webhooks",
        "--secret",
        SECRET,
        "--curl",
        "http://127.0.0.1:9/hooks",
        str(payload),
    )
    assert code == 0 and "-H 'webhook-signature: v1," in out


@pytest.mark.parametrize(
    ("secret", "why"),
    [
        ("plain-secret", "it does not start with whsec_"),
        ("whsec_url-safe_not-standard", "what follows whsec_ is not standard base64"),
    ],
)
def test_a_secret_not_in_whsec_form_is_one_line_and_exit_2(capsys, secret, why):
    payload = str(ROOT / "examples" / "job-failed.json")
    for command in (
        ["sign", "--scheme", "standard-webhooks", "--secret", secret, payload],
        [
            "replay",
            "--scheme",
            "standard-webhooks",
            "--url",
            "http://127.0.0.1:9/",
            "--secret",
            secret,
            payload,
        ],
    ):
        code, out, err = cli(capsys, *command)
        assert (code, out) == (2, "")
        assert err == (
            f"receiver: {command[0]}: --secret must be whsec_<base64> for Standard Webhooks "
            f"({why})\n"
        )


async def test_replay_with_standard_webhooks_reaches_the_documented_consumer(consumer, tmp_path):
    event = tmp_path / "event.json"
    event.write_bytes(Envelope({"envelope": "cloudevents"}).structured(enriched_event()))
    args = ["replay", "--scheme", "standard-webhooks", "--url", consumer.url, str(event)]
    code, out, err = await run_cli(*args, "--secret", SECRET)
    assert code == 0, out + err
    assert out.strip().splitlines()[-1] == "1 sent, 1 accepted, 0 refused"
    assert consumer.done == {"evt_1"}
    code, out, _ = await run_cli(*args, "--secret", new_standard_webhooks_secret())
    assert code == 1 and out.startswith("401  ")


def test_init_offers_a_standard_webhooks_sink_with_a_fresh_secret(capsys, tmp_path):
    config = tmp_path / "config.toml"
    code, _, err = cli(capsys, "init", "--config", str(config))
    assert code == 0, err
    text = config.read_text()
    tail = text[text.index('# [[sinks]]\n# name = "consumer"') :]
    config.write_text(text.replace(tail, "\n".join(line[2:] for line in tail.splitlines())))
    [_, sink] = load_settings(config, env={}).sinks
    assert sink.options["signing"] == "standard-webhooks"
    Webhook(sink.options["secret"])  # the library takes it
    code, out, err = cli(capsys, "check-config", "--config", str(config))
    assert code == 0 and "consumer (http)" in out, err


def test_check_config_names_each_bad_key(capsys, tmp_path):
    http = {"type": "http", "url": "https://consumer.example/in"}
    config = write_config(
        tmp_path / "config.toml",
        {
            "webhook": {"secrets": ["x"]},
            "sinks": [
                {"name": "a", **http, "secret": "s", "envelope": "json"},
                {
                    "name": "b",
                    **http,
                    "secret": "s",
                    "envelope": "cloudevents",
                    "cloudevents_mode": "batch",
                },
                {"name": "c", **http, "secret": "s", "signing": "svix"},
                {"name": "d", **http, "secret": "whsec_!!", "signing": "standard-webhooks"},
                {"name": "e", "type": "exec", "command": ["cat"], "signing": "service"},
                {"name": "f", "type": "download", "envelope": "cloudevents"},
                {
                    "name": "g",
                    "type": "slack",
                    "url": "https://hooks.example/x",
                    "envelope": "receiver",
                },
            ],
        },
    )
    code, out, err = cli(capsys, "check-config", "--config", str(config))
    assert (code, out) == (2, "")
    assert_one_clean_line(err)
    assert err.splitlines() == [
        "receiver: config: sinks.a.envelope: must be one of receiver, cloudevents",
        "receiver: config: sinks.b.cloudevents_mode: must be one of structured, binary",
        "receiver: config: sinks.c.signing: must be one of service, standard-webhooks",
        "receiver: config: sinks.d.secret: must be whsec_<base64> for Standard Webhooks (what "
        'follows whsec_ is not standard base64) (signing = "standard-webhooks")',
        "receiver: config: sinks.e.signing: not a key of exec sinks (only http sinks take it)",
        "receiver: config: sinks.f.envelope: not a key of download sinks "
        "(only redis, amqp, nats, http, exec sinks take it)",
        "receiver: config: sinks.g.envelope: not a key of slack sinks "
        "(only redis, amqp, nats, http, exec sinks take it)",
    ]
