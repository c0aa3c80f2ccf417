"""Accepted webhooks are logged with the real client address, and only at debug level."""

import json
import time

import pytest
from structlog.testing import capture_logs

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.signature import webhook_headers

SECRET = "whsec_client_log"


def settings(tmp_path, level):
    return parse_settings(
        {
            "webhook": {"secrets": [SECRET]},
            "server": {"trusted_proxies": ["127.0.0.1"]},
            "store": {"url": f"sqlite:///{tmp_path}/inbox.db"},
            "log": {"level": level},
            "sinks": [{"name": "files", "type": "download", "directory": str(tmp_path / "dl")}],
        },
        env={},
    )


async def post_through_proxy(client, event_id):
    body = json.dumps(
        {"id": event_id, "object": "event", "event": "job.completed", "job_id": "job-1"}
    ).encode()
    headers = webhook_headers(
        SECRET, body, int(time.time()), event_id=event_id, event_name="job.completed"
    )
    # The test client connects from 127.0.0.1, a trusted proxy: the forwarded address is believed.
    headers["X-Forwarded-For"] = "198.51.100.7"
    response = await client.post("/webhooks", data=body, headers=headers)
    assert response.status == 200


@pytest.mark.parametrize(("level", "logged"), [("debug", True), ("info", False)])
async def test_accepted_webhook_logged_with_client_only_at_debug(
    aiohttp_client, tmp_path, level, logged
):
    async with Runtime(settings(tmp_path, level), role="intake") as runtime:
        client = await aiohttp_client(runtime.public_app())
        with capture_logs() as logs:
            await post_through_proxy(client, "evt-log-1")
    accepted = [entry for entry in logs if entry["event"] == "webhook accepted"]
    if logged:
        assert accepted == [
            {
                "event": "webhook accepted",
                "log_level": "debug",
                "logger_name": "receiver.intake",
                "event_id": "evt-log-1",
                "job_id": "job-1",
                "event_name": "job.completed",
                "client": "198.51.100.7",
            }
        ]
    else:
        assert accepted == []
