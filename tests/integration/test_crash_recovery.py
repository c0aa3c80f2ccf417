"""A real ``receiver serve`` process killed or stopped mid-delivery loses nothing."""

import time

import pytest

from tests.support.helpers import ReceiverProcess, free_port, post_webhook, wait_for, write_config
from tests.support.upstream import rely_on, serve_upstream

SECRET = "whsec_crash"
API_KEY = "service_" + "ef" * 32


@pytest.fixture
async def upstream(aiohttp_server):
    return await serve_upstream(aiohttp_server, api_key=API_KEY, seed=11)


def config(tmp_path, upstream, *, lease=5, drain=2.0):
    return write_config(
        tmp_path / "config.toml",
        {
            "server": {"host": "127.0.0.1", "port": free_port(), "shutdown_timeout_seconds": drain},
            "admin": {"port": free_port()},
            "webhook": {"secrets": [SECRET]},
            "api": {"base_url": upstream.base_url, "api_key": API_KEY, "timeout_seconds": 30},
            "store": {"url": "sqlite:///inbox.db"},
            "worker": {
                "lease_seconds": lease,
                "poll_interval_seconds": 0.1,
                "backoff_initial_seconds": 0.1,
                "backoff_max_seconds": 0.5,
            },
            "log": {"format": "json"},
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


def files(tmp_path):
    return sorted(p for p in (tmp_path / "downloads").rglob("*") if p.is_file())


async def test_killed_mid_delivery_the_event_is_delivered_after_restart(tmp_path, upstream):
    proc = ReceiverProcess(config(tmp_path, upstream, lease=5))
    proc.start()
    try:
        await proc.wait_ready()
        upstream.latency_seconds = 30  # the worker is stuck talking to the upstream
        rely_on(upstream, event=["asset_ids"])  # two files to wait for
        payload = upstream.add_job("image")
        url = f"http://127.0.0.1:{proc.public_port}/webhooks"
        assert await post_webhook(url, SECRET, payload) == 200

        async def fetching():
            return upstream.requests["GET /v1/jobs/{id}"] >= 1

        await wait_for(fetching, what="the worker to call the upstream")
        proc.kill()
        assert files(tmp_path) == []

        upstream.latency_seconds = 0
        started = time.monotonic()
        proc.start()
        await proc.wait_ready()

        async def delivered():
            return len(files(tmp_path)) == 2

        await wait_for(delivered, timeout=30, what="files after restart")
        # The first process's claim had to expire before the event could be taken again.
        assert time.monotonic() - started >= 3
        # A duplicate retry from the upstream is still acknowledged, and nothing is redone.
        assert await post_webhook(url, SECRET, payload) == 200
        assert "Traceback" not in proc.log()
        assert "crashed" not in proc.log()
    finally:
        proc.stop()


async def test_sigterm_answers_in_flight_releases_claims_and_exits_0(tmp_path, upstream):
    proc = ReceiverProcess(config(tmp_path, upstream, lease=120, drain=1.0))
    proc.start()
    try:
        await proc.wait_ready()
        upstream.latency_seconds = 30
        rely_on(upstream, event=["asset_ids"])  # two files to wait for
        payload = upstream.add_job("image")
        url = f"http://127.0.0.1:{proc.public_port}/webhooks"
        assert await post_webhook(url, SECRET, payload) == 200

        async def fetching():
            return upstream.requests["GET /v1/jobs/{id}"] >= 1

        await wait_for(fetching, what="the worker to call the upstream")
        started = time.monotonic()
        assert proc.terminate() == 0
        assert time.monotonic() - started < 8
        assert '"shutting down"' in proc.log()

        upstream.latency_seconds = 0
        proc.start()
        await proc.wait_ready()

        async def delivered():
            return len(files(tmp_path)) == 2

        # Far sooner than the 120 s lease: the claim was released at shutdown.
        await wait_for(delivered, timeout=15, what="files after a graceful restart")
    finally:
        proc.stop()
