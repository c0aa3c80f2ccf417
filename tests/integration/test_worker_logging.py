"""The worker's log line for a processed event (its keyword once clashed with structlog's own)."""

import pytest
from structlog.testing import capture_logs

from receiver.app import Runtime
from tests.support.helpers import wait_for
from tests.support.pipeline import download_settings, send, settled
from tests.support.upstream import serve_upstream

SECRET = "whsec_worker_logging"
API_KEY = "service_" + "ab" * 32


@pytest.fixture
async def upstream(aiohttp_server):
    return await serve_upstream(aiohttp_server, api_key=API_KEY, seed=3)


async def test_a_processed_event_is_logged(aiohttp_client, tmp_path, upstream) -> None:
    payload = upstream.add_job("logo")
    with capture_logs() as logs:
        settings = download_settings(
            upstream,
            tmp_path,
            secret=SECRET,
            api_key=API_KEY,
        )
        async with Runtime(settings) as runtime:
            client = await aiohttp_client(runtime.public_app())
            await send(client, payload, SECRET)
            await settled(runtime, payload["id"])

            async def logged() -> bool:
                return any(e["event"] == "event processed" for e in logs)

            await wait_for(logged, what="the processed line")
    (line,) = [e for e in logs if e["event"] == "event processed"]
    assert line["event_name"] == "job.completed"
