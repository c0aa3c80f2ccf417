"""deploy/caddy/Caddyfile, run by a real Caddy with internal TLS in front of a real receiver."""

import json
import ssl
import time

import aiohttp
import pytest

from receiver.signature import webhook_headers
from receiver.simulator import Simulator
from tests.conftest import require_tool
from tests.deploy.support import DEPLOY, Background, json_lines, run_tool
from tests.helpers import ReceiverProcess, free_port, wait_for, write_config

CADDYFILE = DEPLOY / "caddy" / "Caddyfile"
SECRET = "whsec_behind_caddy"
API_KEY = "service_" + "ca" * 32
PROXY = "127.0.0.1"  # Caddy connects to the receiver from here: the trusted proxy
CLIENT = "127.0.0.2"  # the webhook sender, a different loopback address
STRANGER = "127.0.0.3"  # a sender that reaches the receiver without going through Caddy
FORGED = "203.0.113.66"


def site_block(text):
    """The Caddyfile without its global options block (the first top-level ``{ ... }``)."""
    lines = text.splitlines()
    start = lines.index("{")
    end = lines.index("}", start)
    return "\n".join(lines[end + 1 :]) + "\n"


def test_caddyfile_is_valid_and_formatted(tmp_path):
    caddy = require_tool("caddy")
    env_free = run_tool(
        [caddy, "validate", "--config", str(CADDYFILE), "--adapter", "caddyfile"], cwd=tmp_path
    )
    assert "Valid configuration" in env_free
    assert run_tool([caddy, "fmt", str(CADDYFILE)]) == CADDYFILE.read_text()


@pytest.fixture
async def upstream(aiohttp_server):
    sim = Simulator(api_key=API_KEY, seed=5)
    server = await aiohttp_server(sim.create_app())
    sim.base_url = str(server.make_url("/v1"))
    return sim


@pytest.fixture
async def receiver(tmp_path, upstream):
    config = write_config(
        tmp_path / "config.toml",
        {
            "server": {"host": "127.0.0.1", "port": free_port(), "trusted_proxies": [PROXY]},
            "admin": {"port": free_port()},
            "webhook": {"secrets": [SECRET]},
            "api": {"base_url": upstream.base_url, "api_key": API_KEY},
            "store": {"url": "sqlite:///inbox.db"},
            "worker": {"poll_interval_seconds": 0.1, "backoff_initial_seconds": 0.1},
            "log": {"level": "debug", "format": "json"},
            "sinks": [
                {
                    "name": "files",
                    "type": "download",
                    "directory": "downloads",
                    "allow_private_networks": True,
                }
            ],
        },
    )
    proc = ReceiverProcess(config)
    proc.start()
    try:
        await proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.fixture
async def caddy(tmp_path, receiver):
    """The shipped site block behind a global block for a test: internal CA, free ports."""
    binary = require_tool("caddy")
    https_port = free_port()
    storage = tmp_path / "caddy-data"
    test_globals = f"""{{
	admin off
	local_certs
	skip_install_trust
	default_bind {PROXY}
	http_port {free_port()}
	https_port {https_port}
	storage file_system {storage}
}}
"""
    caddyfile = tmp_path / "Caddyfile"
    caddyfile.write_text(test_globals + site_block(CADDYFILE.read_text()))
    env = {
        "RECEIVER_DOMAIN": f"{PROXY}:{https_port}",
        "RECEIVER_UPSTREAM": f"127.0.0.1:{receiver.public_port}",
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "xdg-data"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg-config"),
    }
    server = Background(
        [binary, "run", "--config", str(caddyfile), "--adapter", "caddyfile"],
        log_path=tmp_path / "caddy.log",
        cwd=tmp_path,
        env=env,
    ).start()
    root_ca = storage / "pki" / "authorities" / "local" / "root.crt"
    base = f"https://{PROXY}:{https_port}"

    async def serving():
        server.check_running()
        if not root_ca.exists():
            return False
        try:
            async with client_session(root_ca) as s, s.get(base + "/") as r:
                return r.status == 404
        except (aiohttp.ClientError, ssl.SSLError):
            return False

    try:
        await wait_for(serving, timeout=30, interval=0.2, what="Caddy serving HTTPS")
        yield base, root_ca
    finally:
        server.stop()


def client_session(root_ca, source=CLIENT):
    """A session that trusts only Caddy's internal root and connects from ``source``."""
    context = ssl.create_default_context(cafile=str(root_ca))
    connector = aiohttp.TCPConnector(ssl=context, local_addr=(source, 0))
    return aiohttp.ClientSession(connector=connector)


def signed(payload, secret=SECRET):
    body = json.dumps(payload).encode()
    return body, webhook_headers(
        secret, body, int(time.time()), event_id=payload["id"], event_name=payload["event"]
    )


def receiver_lines(receiver, message):
    return [line for line in json_lines(receiver.log()) if line.get("event") == message]


async def test_signed_webhook_over_https_is_accepted_and_processed(
    caddy, receiver, upstream, tmp_path
):
    base, root_ca = caddy
    payload = upstream.add_job("image")
    body, headers = signed(payload)
    async with (
        client_session(root_ca) as s,
        s.post(base + "/webhooks", data=body, headers=headers) as r,
    ):
        assert r.status == 200, await r.text()
        assert (await r.json())["id"] == payload["id"]

    ops = f"http://127.0.0.1:{receiver.ops_port}"

    async def processed():
        async with aiohttp.ClientSession() as s, s.get(f"{ops}/admin/events/{payload['id']}") as r:
            return (await r.json())["data"]["state"] == "done"

    await wait_for(processed, timeout=30, what="the event processed")
    assert any((tmp_path / "downloads").rglob("*.png"))

    # The receiver saw Caddy's connection but logged the sender: Caddy is a trusted proxy.
    accepted = receiver_lines(receiver, "webhook accepted")
    assert [(a["event_id"], a["client"]) for a in accepted] == [(payload["id"], CLIENT)]


async def test_forwarded_for_is_believed_only_from_the_trusted_proxy(caddy, receiver):
    base, root_ca = caddy
    payload = {"id": "evt-forged", "object": "event", "event": "job.failed", "job_id": "j-1"}
    body, headers = signed(payload, secret="whsec_wrong")
    headers["X-Forwarded-For"] = FORGED
    # Through Caddy: Caddy replaces the sender's X-Forwarded-For with the address it saw.
    async with (
        client_session(root_ca) as s,
        s.post(base + "/webhooks", data=body, headers=headers) as r,
    ):
        assert r.status == 401
    # Straight to the receiver from an address that is not a trusted proxy: the header is ignored.
    direct = f"http://127.0.0.1:{receiver.public_port}/webhooks"
    connector = aiohttp.TCPConnector(local_addr=(STRANGER, 0))
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.post(direct, data=body, headers=headers) as r,
    ):
        assert r.status == 401

    async def both_logged():
        return len(receiver_lines(receiver, "webhook rejected")) == 2

    await wait_for(both_logged, what="both rejections logged")
    clients = [line["client"] for line in receiver_lines(receiver, "webhook rejected")]
    assert clients == [CLIENT, STRANGER]
    assert FORGED not in receiver.log()


@pytest.mark.parametrize(
    "path", ["/metrics", "/readyz", "/admin/events", "/healthz", "/webhooks/../metrics", "/"]
)
async def test_ops_paths_are_not_reachable_through_caddy(caddy, receiver, path):
    base, root_ca = caddy
    async with client_session(root_ca) as s, s.get(base + path) as r:
        assert r.status == 404
        assert await r.text() == "Not Found"
    # They exist on the ops listener: it is Caddy that keeps them private.
    if path.strip("/") in ("metrics", "readyz", "admin/events", "healthz"):
        ops = f"http://127.0.0.1:{receiver.ops_port}{path}"
        async with aiohttp.ClientSession() as s, s.get(ops) as r:
            assert r.status == 200
