"""The worker's log line for a processed event (its keyword once clashed with structlog's own)."""

from structlog.testing import capture_logs

from receiver.app import Runtime
from tests.integration.test_pipeline import make_settings, send, settled, upstream  # noqa: F401


async def test_a_processed_event_is_logged(aiohttp_client, tmp_path, upstream) -> None:  # noqa: F811
    payload = upstream.add_job("logo")
    with capture_logs() as logs:
        async with Runtime(make_settings(tmp_path, upstream)) as runtime:
            client = await aiohttp_client(runtime.public_app())
            await send(client, payload)
            await settled(runtime, payload["id"])

            async def logged() -> bool:
                return any(e["event"] == "event processed" for e in logs)

            from tests.helpers import wait_for

            await wait_for(logged, what="the processed line")
    (line,) = [e for e in logs if e["event"] == "event processed"]
    assert line["event_name"] == "job.completed"
