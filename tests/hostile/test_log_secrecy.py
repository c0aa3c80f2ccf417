"""No secret, API key or signed query string in any log line, over a full run.

A real ``receiver serve`` (JSON logs at debug level) processes events from the simulator, whose
webhook bodies and file URLs carry signed query strings; the upstream first refuses the API key,
then accepts it; some file URLs have expired; webhooks are refused for every reason; the admin
API is called with a wrong token. Then every line the process wrote is searched for the webhook
secret, the API keys, the admin token and ``sig=`` / ``expires=`` query strings.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from receiver.signature import webhook_headers
from tests.support.helpers import ReceiverProcess, free_port, wait_for, write_config
from tests.support.upstream import serve_upstream

WEBHOOK_SECRET = "whsec_" + "s3cr3t" * 6
API_KEY = "service_" + "a1" * 32  # the receiver's key
OTHER_KEY = "service_" + "b2" * 32  # the key the upstream wants at first
ADMIN_TOKEN = "admin-" + "t0ken" * 6
WRONG_TOKEN = "wrong-" + "t0ken" * 6
EVENTS = 6


async def post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> int:
    async with session.post(url, data=body, headers=headers) as response:
        await response.read()
        return response.status


def signed(payload: dict[str, Any], secret: str = WEBHOOK_SECRET, *, age: int = 0) -> Any:
    body = json.dumps(payload).encode()
    return body, webhook_headers(
        secret, body, int(time.time()) - age, event_id=payload["id"], event_name=payload["event"]
    )


async def test_no_secret_reaches_a_log_line(aiohttp_server: Any, tmp_path: Path) -> None:
    sim = await serve_upstream(aiohttp_server, api_key=OTHER_KEY, seed=41)
    config = write_config(
        tmp_path / "config.toml",
        {
            "server": {"host": "127.0.0.1", "port": free_port(), "max_body_bytes": 4096},
            "admin": {"port": free_port(), "token": ADMIN_TOKEN},
            "webhook": {"secrets": [WEBHOOK_SECRET]},
            "api": {"base_url": sim.base_url, "api_key": API_KEY, "timeout_seconds": 5},
            "store": {"url": "sqlite:///inbox.db"},
            "worker": {
                "poll_interval_seconds": 0.05,
                "backoff_initial_seconds": 0.05,
                "backoff_max_seconds": 0.2,
                "max_attempts": 1000,
            },
            "log": {"format": "json", "level": "debug"},
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
    url = f"http://127.0.0.1:{proc.public_port}/webhooks"
    ops = f"http://127.0.0.1:{proc.ops_port}"
    proc.start()
    try:
        await proc.wait_ready()
        sim.expired_urls = True  # the first file URLs answer 403 (their query strings are logged?)
        sim.rate_limit_fraction, sim.retry_after = 0.2, 1
        payloads = [sim.add_job("image") for _ in range(EVENTS)]
        async with aiohttp.ClientSession() as session:
            for payload in payloads:
                assert await post(session, url, *signed(payload)) == 200
            # Refused webhooks, each for its own reason.
            victim = sim.add_job("image")
            body, headers = signed(victim, "whsec_not_the_secret")
            assert await post(session, url, body, headers) == 401
            assert await post(session, url, *signed(victim, age=3600)) == 401
            body, headers = signed(victim)
            assert await post(session, url + "?sig=deadbeef&expires=1", body, {}) == 401
            assert await post(session, url, body + b" ", headers) == 401
            assert await post(session, url, body, {**headers, "Content-Encoding": "gzip"}) == 400
            big = {**victim, "padding": "x" * 5000}
            assert await post(session, url, *signed(big)) == 413
            broken = {**victim, "object": "nope"}
            assert await post(session, url, *signed(broken)) == 400
            # The admin API with a wrong token, then the right one.
            wrong = {"Authorization": f"Bearer {WRONG_TOKEN}"}
            async with session.get(f"{ops}/admin/events", headers=wrong) as response:
                assert response.status == 401
            right = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            async with session.get(f"{ops}/admin/events", headers=right) as response:
                assert response.status == 200

            # The upstream refuses the receiver's key for a while, then accepts it.
            async def refused() -> bool:
                return "401" in proc.log()

            await wait_for(refused, 15, 0.1, "the upstream to refuse the API key")
            sim.api_key = API_KEY

            async def expired() -> bool:
                return "HTTP 403" in proc.log()

            await wait_for(expired, 15, 0.1, "a download refused for an expired signed URL")
            sim.expired_urls = False
            sim.rate_limit_fraction = 0.0

            async def processed() -> bool:
                async with session.get(f"{ops}/admin/events?status=done", headers=right) as r:
                    return len((await r.json())["data"]) == EVENTS

            await wait_for(processed, 30, 0.2, "every event processed")
        assert proc.terminate() == 0
    finally:
        proc.stop()

    log = proc.log()
    lines = log.splitlines()
    # The run logged what it should have: rejections, the refused key, downloads.
    assert any('"webhook rejected"' in line for line in lines)
    assert any('"file written"' in line for line in lines)
    assert sum(1 for line in lines if "401" in line) >= 2
    assert len(lines) > 40
    for secret in (WEBHOOK_SECRET, API_KEY, OTHER_KEY, ADMIN_TOKEN, WRONG_TOKEN):
        leaked = [line for line in lines if secret in line]
        assert not leaked, f"{secret[:10]}... in {leaked[:3]}"
    for query in ("sig=", "expires="):
        leaked = [line for line in lines if query in line]
        assert not leaked, f"{query} in {leaked[:3]}"
    assert "Bearer" not in log
