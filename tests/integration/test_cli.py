"""The command line as a user meets it: exit codes, one-line errors, no tracebacks."""

import json
import socket
import time

import pytest

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.signature import verify
from receiver.store.records import NewEvent
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import ROOT, free_port, write_config

SECRET = "whsec_cli"


async def test_check_config_example_masks_secrets():
    key = "service_" + "12" * 32
    code, out, err = await run_cli(
        "check-config", "--config", "config.example.toml", env={"RECEIVER_API_KEY": key}
    )
    assert code == 0, err
    assert "OK" in out and "files (download)" in out
    assert "lane: concurrency 8, rate unlimited; sends receiver" in out
    assert key not in out and "whsec_local_development_secret" not in out


async def test_check_config_shows_each_sinks_envelope_and_signing(tmp_path):
    path = tmp_path / "formats.toml"
    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    path.write_text(
        '[webhook]\nsecrets = ["whsec_x"]\n'
        '[[sinks]]\nname = "plain"\ntype = "http"\nurl = "http://127.0.0.1:9/a"\n'
        'secret = "0123456789abcdef0123"\n'
        '[[sinks]]\nname = "svix"\ntype = "http"\nurl = "http://127.0.0.1:9/b"\n'
        f'secret = "{secret}"\nsigning = "standard-webhooks"\n'
        'envelope = "cloudevents"\ncloudevents_mode = "binary"\n'
        '[[sinks]]\nname = "stream"\ntype = "redis"\nurl = "redis://127.0.0.1:6379/0"\n'
        'stream = "s"\nenvelope = "cloudevents"\n'
    )
    code, out, err = await run_cli("check-config", "--config", str(path))
    assert code == 0, err
    assert "rate unlimited; sends receiver, signed service\n" in out
    assert "sends cloudevents (binary mode), signed standard-webhooks\n" in out
    assert "sends cloudevents (structured mode)\n" in out
    assert secret not in out


async def test_check_config_lists_every_problem_naming_keys(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(
        '[store]\nretention_hours = 12\n[server]\nport = "x"\n'
        '[[sinks]]\nname = "q"\ntype = "download"\nbogus = 1\n'
    )
    code, _out, err = await run_cli("check-config", "--config", str(path))
    assert code == 2
    assert_one_clean_line(err)
    for key in ("store.retention_hours", "server.port", "sinks.q.bogus", "webhook.secrets"):
        assert key in err


@pytest.mark.parametrize("content,needle", [(None, "not found"), ("[x", "not valid TOML")])
async def test_unreadable_config_is_one_line(tmp_path, content, needle):
    path = tmp_path / "c.toml"
    if content is not None:
        path.write_text(content)
    code, _, err = await run_cli("check-config", "--config", str(path))
    assert code == 2 and needle in err
    assert_one_clean_line(err)
    assert len(err.strip().splitlines()) == 1


async def test_config_from_environment_variable(tmp_path):
    code, out, _ = await run_cli(
        "check-config", env={"RECEIVER_CONFIG": str(ROOT / "config.example.toml")}, cwd=tmp_path
    )
    assert code == 0 and "config.example.toml" in out


async def test_sign_prints_curl_ready_headers_that_verify():
    file = ROOT / "examples" / "image-completed.json"
    code, out, err = await run_cli(
        "sign", "--secret", SECRET, "--timestamp", "1800000000", str(file)
    )
    assert code == 0, err
    headers = dict(line.split(": ", 1) for line in out.strip().splitlines())
    body = file.read_bytes()
    assert headers["Service-Event-Id"] == json.loads(body)["id"]
    verify(
        secrets=[SECRET],
        body=body,
        header=headers["Service-Signature"],
        now=1800000000,
        tolerance_seconds=300,
    )


async def test_sign_missing_file():
    code, _, err = await run_cli("sign", "--secret", "s", "nope.json")
    assert code == 1 and "nope.json" in err
    assert_one_clean_line(err)


async def test_usage_errors_are_one_line():
    code, _, err = await run_cli("frobnicate")
    assert code == 2 and "Traceback" not in err
    code, _, err = await run_cli("events", "redeliver", "--config", "config.example.toml")
    assert code != 0 and "Traceback" not in err


@pytest.fixture
async def live_receiver(aiohttp_server, tmp_path):
    settings = parse_settings(
        {"webhook": {"secrets": [SECRET]}, "store": {"url": f"sqlite:///{tmp_path}/r.db"}}, env={}
    )
    runtime = Runtime(settings, role="intake")
    async with runtime:
        server = await aiohttp_server(runtime.public_app())
        yield runtime, str(server.make_url("/webhooks"))


async def test_replay_a_folder_of_examples(live_receiver):
    runtime, url = live_receiver
    code, out, err = await run_cli("replay", "--url", url, "--secret", SECRET, "examples")
    assert code == 0, out + err
    lines = out.strip().splitlines()
    assert lines[-1] == "5 sent, 5 accepted, 0 refused"
    assert all(line.startswith("200") for line in lines[:-1])
    assert len(await runtime.store.list()) == 5
    code, out, _ = await run_cli(
        "replay", "--url", url, "--secret", SECRET, "examples/logo-completed.json"
    )
    assert code == 0 and "(duplicate)" in out


async def test_replay_reports_refusals_with_nonzero_exit(live_receiver):
    _, url = live_receiver
    code, out, _ = await run_cli("replay", "--url", url, "--secret", "wrong", "examples")
    assert code == 1
    assert "401" in out and "invalid_signature" in out
    assert out.strip().splitlines()[-1] == "5 sent, 0 accepted, 5 refused"


async def test_replay_to_nothing_listening():
    port = free_port()
    code, out, err = await run_cli(
        "replay",
        "--url",
        f"http://127.0.0.1:{port}/webhooks",
        "--secret",
        SECRET,
        "examples/logo-completed.json",
    )
    assert code == 1 and out.startswith("ERR") and "Traceback" not in err


async def test_events_list_show_redeliver(tmp_path):
    config = write_config(
        tmp_path / "c.toml",
        {
            "webhook": {"secrets": [SECRET]},
            "store": {"url": "sqlite:///inbox.db"},
            "sinks": [{"name": "files", "type": "download"}],
        },
    )
    settings = parse_settings(
        {"webhook": {"secrets": [SECRET]}, "store": {"url": f"sqlite:///{tmp_path}/inbox.db"}},
        env={},
    )
    from receiver.store import open_store

    store = open_store(settings.store)
    await store.open()
    body = json.dumps(
        {"id": "evt-9", "object": "event", "event": "job.completed", "job_id": "job-9"}
    ).encode()
    await store.add_event(
        NewEvent(
            id="evt-9",
            event="job.completed",
            job_id="job-9",
            body=body,
            headers={},
            received_at=time.time(),
            sinks=("files",),
        )
    )
    await store.close()

    code, out, err = await run_cli("events", "list", "--config", str(config), cwd=tmp_path)
    assert code == 0, err
    assert "evt-9" in out and "pending" in out
    code, out, _ = await run_cli("events", "show", "evt-9", "--config", str(config), cwd=tmp_path)
    assert json.loads(out)["payload"]["job_id"] == "job-9"
    code, out, _ = await run_cli(
        "events", "redeliver", "evt-9", "--config", str(config), cwd=tmp_path
    )
    assert code == 0 and "1 deliveries" in out
    code, out, _ = await run_cli(
        "events", "redeliver", "--dead", "--config", str(config), cwd=tmp_path
    )
    assert code == 0 and out.startswith("0 dead")
    code, _, err = await run_cli("events", "show", "nope", "--config", str(config), cwd=tmp_path)
    assert code == 1 and "nope" in err
    assert_one_clean_line(err)


async def test_serve_with_a_busy_port_is_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = write_config(
            tmp_path / "c.toml",
            {
                "server": {"host": "127.0.0.1", "port": port},
                "admin": {"port": free_port()},
                "webhook": {"secrets": [SECRET]},
                "store": {"url": "sqlite:///inbox.db"},
            },
        )
        code, _, err = await run_cli("serve", "--config", str(config), cwd=tmp_path)
    assert code == 1
    assert "Traceback" not in err
    assert "address already in use" in err.lower()
