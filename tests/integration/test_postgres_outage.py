"""A receiver on Postgres when the database goes away: 503 (never 2xx), back off, resume.

Postgres itself is shared here, so it is never stopped: a proxy whose port is closed plays a
database restart, and ``pg_terminate_backend`` on the receiver's own connections plays dropped
connections.
"""

import asyncio
import time

import pytest
from structlog.testing import capture_logs

from receiver.app import Runtime
from tests.support.expect import expected_files
from tests.support.helpers import wait_for
from tests.support.pipeline import download_sink, fast_settings, signed
from tests.support.postgres import TcpProxy, fresh_schema, require_postgres, terminate_backends
from tests.support.upstream import serve_upstream

SECRET = "whsec_outage"
API_KEY = "service_" + "cd" * 32


@pytest.fixture
async def upstream(aiohttp_server):
    return await serve_upstream(aiohttp_server, api_key=API_KEY, seed=5)


@pytest.fixture
async def schema():
    require_postgres()
    async with fresh_schema() as name:
        yield name


def make_settings(tmp_path, upstream, store):
    return fast_settings(
        upstream,
        secret=SECRET,
        api_key=API_KEY,
        store={"pool_size": 4, "timeout_seconds": 2, **store},
        sinks=[download_sink(tmp_path / "dl")],
        # A settle or release cut off by the outage leaves its claim until the lease ends: keep
        # it short so the test sees the takeover.
        worker={"lease_seconds": 5},
    )


async def send(client, payload):
    body, headers = signed(payload, SECRET)
    response = await client.post("/webhooks", data=body, headers=headers)
    await response.read()
    return response.status


async def resend_until_stored(client, payloads):
    """What the upstream does: retry every refused event until it gets a 2xx."""
    statuses = set()
    waiting = list(payloads)
    deadline = time.monotonic() + 30
    while waiting and time.monotonic() < deadline:
        results = await asyncio.gather(*(send(client, p) for p in waiting))
        statuses.update(results)
        waiting = [p for p, status in zip(waiting, results, strict=True) if status != 200]
        if waiting:
            await asyncio.sleep(0.1)
    assert not waiting, f"{len(waiting)} events never stored"
    return statuses


async def all_done(runtime, payloads, timeout=30.0):
    async def check():
        counts, _ = await runtime.store.counts()
        return counts == {"pending": 0, "done": len(payloads), "dead": 0}

    await wait_for(check, timeout, what=f"{len(payloads)} events processed")


def files_under(root):
    """The files written (relative paths), without the sink's temporary ones."""
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }


async def test_database_down_intake_answers_503_workers_back_off_and_resume(
    aiohttp_client, tmp_path, upstream, schema
):
    proxy = TcpProxy()
    await proxy.start()
    settings = make_settings(tmp_path, upstream, {"url": proxy.url(), "schema": schema})
    try:
        async with Runtime(settings) as runtime:
            public = await aiohttp_client(runtime.public_app())
            ops = await aiohttp_client(runtime.ops_app())
            first = upstream.add_job("image")
            assert await send(public, first) == 200
            await all_done(runtime, [first])

            with capture_logs() as logs:
                await proxy.stop()
                outage = [upstream.add_job("image") for _ in range(5)]
                statuses = [await send(public, p) for p in outage]
                assert statuses == [503] * 5
                assert (await ops.get("/readyz")).status == 503

                async def backing_off():
                    return any(e["event"] == "claim failed; retrying" for e in logs)

                await wait_for(backing_off, what="the worker to back off")
            assert all("retry_in" in e for e in logs if e["event"] == "claim failed; retrying")

            await proxy.start()  # the database is back
            assert await resend_until_stored(public, outage) == {200}
            await all_done(runtime, [first, *outage])
            assert (await ops.get("/readyz")).status == 200
            assert files_under(tmp_path / "dl") == expected_files(upstream, [first, *outage])
            unavailable = runtime.metrics.webhook_requests.labels("unavailable").get()
            assert unavailable == 5
    finally:
        await proxy.stop()


async def test_dropped_connections_mid_traffic_never_answer_2xx_for_a_lost_event(
    aiohttp_client, tmp_path, upstream, schema
):
    from tests.support.postgres import url_with

    name = "receiver-outage-" + schema[-8:]
    settings = make_settings(
        tmp_path, upstream, {"url": url_with(application_name=name), "schema": schema}
    )
    payloads = [upstream.add_job("logo") for _ in range(150)]
    async with Runtime(settings) as runtime:
        public = await aiohttp_client(runtime.public_app())
        killed = 0

        async def kill_twice():
            nonlocal killed
            for _ in range(2):
                await asyncio.sleep(0.05)
                killed += await terminate_backends(name)

        statuses, _ = await asyncio.gather(resend_until_stored(public, payloads), kill_twice())
        assert killed >= 1
        assert statuses <= {200, 503}
        await all_done(runtime, payloads)
        stored = {e.id for e in await runtime.store.list(limit=1000)}
        assert stored == {p["id"] for p in payloads}
        expected = expected_files(upstream, payloads)
        assert files_under(tmp_path / "dl") == expected and len(expected) > 100
