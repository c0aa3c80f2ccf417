"""deploy/caddy/Caddyfile and deploy/nginx/receiver.conf, run for real in front of a receiver.

Each proxy serves HTTPS on loopback (Caddy from its internal CA, nginx with a certificate made
for the test) in front of a real ``receiver serve``: a signed webhook is accepted and processed,
the ops paths are not reachable, and the receiver logs the sender's address only because the
proxy's address is in ``server.trusted_proxies``. The sender uses another loopback address
(127.0.0.2) than the proxy's (127.0.0.1), so the two can be told apart.
"""

import contextlib
import json
import os
import ssl
import time

import aiohttp
import pytest
from yarl import URL

from receiver.signature import webhook_headers
from tests.deploy.support import DEPLOY, Background, json_lines, run_tool
from tests.support.helpers import ReceiverProcess, free_port, wait_for, write_config
from tests.support.services import require_tool
from tests.support.upstream import serve_upstream

CADDYFILE = DEPLOY / "caddy" / "Caddyfile"
NGINX_CONF = DEPLOY / "nginx" / "receiver.conf"
SECRET = "whsec_behind_a_proxy"
API_KEY = "service_" + "ca" * 32
PROXY = "127.0.0.1"  # the proxies connect to the receiver from here: the trusted proxy
CLIENT = "127.0.0.2"  # the webhook sender
STRANGER = "127.0.0.3"  # a sender that reaches the receiver without going through a proxy
FORGED = "203.0.113.66"
OPS_PATHS = ("/metrics", "/readyz", "/healthz", "/admin/events")


def caddy_site_block(text):
    """The Caddyfile without its global options block (the first top-level ``{ ... }``)."""
    lines = text.splitlines()
    start = lines.index("{")
    end = lines.index("}", start)
    return "\n".join(lines[end + 1 :]) + "\n"


def render(text, replacements):
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    return text


def test_caddyfile_is_valid_and_formatted(tmp_path):
    caddy = require_tool("caddy")
    output = run_tool(
        [caddy, "validate", "--config", str(CADDYFILE), "--adapter", "caddyfile"],
        cwd=tmp_path,
    )
    assert "Valid configuration" in output
    assert run_tool([caddy, "fmt", str(CADDYFILE)]) == CADDYFILE.read_text()


@contextlib.asynccontextmanager
async def caddy_in_front(tmp_path, receiver):
    """The shipped site block behind a global block for the test: internal CA, free ports.

    ``local_certs`` is the global form of ``tls internal``: every site gets its certificate
    from Caddy's own CA, whose root the test client trusts.
    """
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
    caddyfile.write_text(test_globals + caddy_site_block(CADDYFILE.read_text()))
    server = Background(
        [binary, "run", "--config", str(caddyfile), "--adapter", "caddyfile"],
        log_path=tmp_path / "caddy.log",
        cwd=tmp_path,
        env={
            "RECEIVER_DOMAIN": f"{PROXY}:{https_port}",
            "RECEIVER_UPSTREAM": f"127.0.0.1:{receiver.public_port}",
            "HOME": str(tmp_path),
            "XDG_DATA_HOME": str(tmp_path / "xdg-data"),
            "XDG_CONFIG_HOME": str(tmp_path / "xdg-config"),
        },
    ).start()
    try:
        base = f"https://{PROXY}:{https_port}"
        root_ca = storage / "pki" / "authorities" / "local" / "root.crt"
        await wait_serving(server, base, root_ca)
        yield base, root_ca
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def nginx_in_front(tmp_path, receiver):
    """The shipped server blocks on free loopback ports with a certificate made for the test."""
    binary = require_tool("nginx")
    openssl = require_tool("openssl")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    run_tool(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", f"/CN={PROXY}", "-addext",
         f"subjectAltName=IP:{PROXY}", "-keyout", str(key), "-out", str(cert)]
    )  # fmt: skip
    https_port = free_port()
    site = render(
        NGINX_CONF.read_text(),
        [
            ("server 127.0.0.1:8080;", f"server 127.0.0.1:{receiver.public_port};"),
            ("listen 80;", f"listen {PROXY}:{free_port()};"),
            ("listen [::]:80;", ""),
            ("listen 443 ssl http2;", f"listen {PROXY}:{https_port} ssl http2;"),
            ("listen [::]:443 ssl http2;", ""),
            ("/etc/letsencrypt/live/hooks.example.com/fullchain.pem", str(cert)),
            ("/etc/letsencrypt/live/hooks.example.com/privkey.pem", str(key)),
        ],
    )
    (tmp_path / "receiver.conf").write_text(site)
    temp = tmp_path / "nginx-temp"
    temp.mkdir()
    # Workers would otherwise run as "nobody", which cannot enter the test's private folders.
    user = "user root root;" if os.geteuid() == 0 else ""
    main = tmp_path / "nginx.conf"
    main.write_text(
        f"""daemon off;
{user}
worker_processes 1;
pid {tmp_path}/nginx.pid;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
    include {tmp_path}/receiver.conf;
}}
"""
    )
    args = [binary, "-c", str(main), "-p", str(tmp_path), "-e", str(tmp_path / "nginx-error.log")]
    checked = run_tool([*args, "-t"])
    assert "syntax is ok" in checked and "test is successful" in checked, checked
    server = Background(args, log_path=tmp_path / "nginx.log", cwd=tmp_path).start()
    try:
        base = f"https://{PROXY}:{https_port}"
        await wait_serving(server, base, cert)
        yield base, cert
    finally:
        server.stop()


FRONTS = {"caddy": caddy_in_front, "nginx": nginx_in_front}


async def wait_serving(server, base, ca_file):
    async def serving():
        server.check_running()
        if not ca_file.exists():
            return False
        try:
            async with client_session(ca_file) as s, s.get(base + "/") as r:
                return r.status == 404
        except (aiohttp.ClientError, ssl.SSLError):
            return False

    await wait_for(serving, timeout=30, interval=0.2, what=f"{server.args[0]} serving HTTPS")


def client_session(ca_file, source=CLIENT):
    """A session that trusts only ``ca_file`` and connects from ``source``."""
    context = ssl.create_default_context(cafile=str(ca_file))
    connector = aiohttp.TCPConnector(ssl=context, local_addr=(source, 0))
    return aiohttp.ClientSession(connector=connector)


@pytest.fixture
async def upstream(aiohttp_server):
    return await serve_upstream(aiohttp_server, api_key=API_KEY, seed=5)


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


@pytest.fixture(params=sorted(FRONTS))
async def proxy(request, tmp_path, receiver):
    async with FRONTS[request.param](tmp_path, receiver) as front:
        yield front


def signed(payload, secret=SECRET):
    body = json.dumps(payload).encode()
    return body, webhook_headers(
        secret, body, int(time.time()), event_id=payload["id"], event_name=payload["event"]
    )


def receiver_lines(receiver, message):
    return [line for line in json_lines(receiver.log()) if line.get("event") == message]


async def test_signed_webhook_over_https_is_accepted_and_processed(
    proxy, receiver, upstream, tmp_path
):
    base, ca_file = proxy
    payload = upstream.add_job("image")
    body, headers = signed(payload)
    async with (
        client_session(ca_file) as s,
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

    # The receiver saw the proxy's connection but logged the sender: the proxy is trusted.
    accepted = receiver_lines(receiver, "webhook accepted")
    assert [(a["event_id"], a["client"]) for a in accepted] == [(payload["id"], CLIENT)]


async def test_forwarded_for_is_believed_only_from_the_trusted_proxy(proxy, receiver):
    base, ca_file = proxy
    payload = {"id": "evt-forged", "object": "event", "event": "job.failed", "job_id": "j-1"}
    body, headers = signed(payload, secret="whsec_wrong")
    headers["X-Forwarded-For"] = FORGED
    # Through the proxy: it replaces the sender's X-Forwarded-For with the address it saw.
    async with (
        client_session(ca_file) as s,
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


async def test_ops_paths_are_not_reachable_through_the_proxy(proxy, receiver):
    base, ca_file = proxy
    async with client_session(ca_file) as s:
        for path in (*OPS_PATHS, "/webhooks/../metrics", "/webhooks/%2e%2e/metrics", "/"):
            for method in ("GET", "POST"):
                # encoded=True: the path is sent as written, dot segments included.
                async with s.request(method, URL(base + path, encoded=True)) as r:
                    assert r.status == 404, (method, path)
                    assert "aiohttp" not in r.headers.get("Server", ""), (method, path)
    # They exist on the ops listener: it is the proxy that keeps them private.
    async with aiohttp.ClientSession() as s:
        for path in OPS_PATHS:
            async with s.get(f"http://127.0.0.1:{receiver.ops_port}{path}") as r:
                assert r.status == 200, path
