"""The upstream client against the real simulator: answers and failures worth retrying.

429 with and without Retry-After (seconds or an HTTP date), 5xx, timeouts, refused connections
and a closed session: each a ``TransientError``, counted in the metrics.
"""

from __future__ import annotations

import socket
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from receiver.errors import (
    TransientError,
)
from receiver.observe.metrics import Metrics
from receiver.simulator import Simulator
from receiver.upstream.client import UpstreamClient
from tests.support.upstream_client_cases import (
    API_KEY,
    client,
    count,
    metrics,
    observed,
    server,
    session,
    sim,
)

__all__ = ["client", "metrics", "server", "session", "sim"]  # fixtures, used by name


# ------------------------------------------------------------------ 429 and 5xx


async def test_429_with_retry_after_seconds(
    client: UpstreamClient, sim: Simulator, metrics: Metrics
) -> None:
    job_id = sim.add_job("image")["job_id"]
    sim.rate_limit_fraction = 1.0
    sim.retry_after = 7

    with pytest.raises(TransientError) as info:
        await client.get_job(job_id)

    assert type(info.value) is TransientError
    assert info.value.retry_after == 7
    assert "429" in str(info.value) and "rate_limited" in str(info.value)
    assert count(metrics, "/jobs/{id}", "429") == 1


async def test_429_with_retry_after_http_date(client: UpstreamClient, sim: Simulator) -> None:
    job_id = sim.add_job("image")["job_id"]
    sim.rate_limit_fraction = 1.0
    sim.retry_after = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)

    with pytest.raises(TransientError) as info:
        await client.get_job(job_id)

    assert info.value.retry_after is not None
    assert 25 <= info.value.retry_after <= 31


async def test_429_with_a_past_http_date_waits_zero(client: UpstreamClient, sim: Simulator) -> None:
    job_id = sim.add_job("image")["job_id"]
    sim.rate_limit_fraction = 1.0
    sim.retry_after = "Wed, 21 Oct 2015 07:28:00 GMT"

    with pytest.raises(TransientError) as info:
        await client.get_job(job_id)

    assert info.value.retry_after == 0


async def test_429_without_retry_after(client: UpstreamClient, sim: Simulator) -> None:
    job_id = sim.add_job("image")["job_id"]
    sim.rate_limit_fraction = 1.0

    with pytest.raises(TransientError) as info:
        await client.get_job(job_id)

    assert info.value.retry_after is None


@pytest.mark.parametrize(
    ("status", "code"), [(500, "internal"), (502, "upstream_error"), (503, "upstream_error")]
)
async def test_5xx_is_transient(
    client: UpstreamClient, sim: Simulator, metrics: Metrics, status: int, code: str
) -> None:
    asset_id = sim.jobs[sim.add_job("scene")["job_id"]].asset_ids["scene"]
    sim.error_fraction = 1.0
    sim.error_status = status

    with pytest.raises(TransientError) as info:
        await client.get_asset(asset_id)

    assert type(info.value) is TransientError
    assert str(status) in str(info.value) and code in str(info.value)
    assert count(metrics, "/assets/{id}", str(status)) == 1


async def test_some_rate_limited_calls_then_success(client: UpstreamClient, sim: Simulator) -> None:
    job_id = sim.add_job("image")["job_id"]
    sim.rate_limit_fraction = 0.5
    outcomes = []
    for _ in range(20):
        try:
            await client.get_job(job_id)
            outcomes.append("ok")
        except TransientError:
            outcomes.append("429")
    assert "ok" in outcomes and "429" in outcomes


# ------------------------------------------------------------------ network failures


async def test_timeout(
    sim: Simulator, server: TestServer, session: aiohttp.ClientSession, metrics: Metrics
) -> None:
    job_id = sim.add_job("image")["job_id"]
    sim.latency_seconds = 2.0
    client = UpstreamClient(
        session=session,
        base_url=str(server.make_url("/v1")),
        api_key=API_KEY,
        timeout=0.2,
        metrics=metrics,
    )

    started = time.monotonic()
    with pytest.raises(TransientError) as info:
        await client.get_job(job_id)

    assert time.monotonic() - started < 1.5
    assert "within 0.2s" in str(info.value)
    assert isinstance(info.value.__cause__, TimeoutError)
    assert count(metrics, "/jobs/{id}", "timeout") == 1
    assert observed(metrics, "/jobs/{id}") == 1


async def test_connection_refused(session: aiohttp.ClientSession, metrics: Metrics) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = UpstreamClient(
        session=session,
        base_url=f"http://127.0.0.1:{port}/v1",
        api_key=API_KEY,
        timeout=5,
        metrics=metrics,
    )

    with pytest.raises(TransientError) as info:
        await client.get_asset("0b7c1e62-3f2a-4c4e-9d55-5d1f0a7c9e10")

    assert isinstance(info.value.__cause__, aiohttp.ClientError)
    assert count(metrics, "/assets/{id}", "error") == 1


async def test_closed_session_is_transient() -> None:
    session = aiohttp.ClientSession()
    await session.close()
    client = UpstreamClient(
        session=session, base_url="http://127.0.0.1:9/v1", api_key=API_KEY, timeout=1
    )
    with pytest.raises(TransientError):
        await client.get_job("x")
