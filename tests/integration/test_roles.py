"""``--role intake`` and ``--role worker`` as two processes sharing one SQLite inbox."""

import aiohttp
import pytest

from tests.support.expect import expected_files
from tests.support.helpers import ReceiverProcess, free_port, post_webhook, wait_for, write_config
from tests.support.upstream import serve_upstream

SECRET = "whsec_roles"
API_KEY = "service_" + "9a" * 32


@pytest.fixture
async def upstream(aiohttp_server):
    return await serve_upstream(aiohttp_server, api_key=API_KEY, seed=5)


def config(path, upstream):
    return write_config(
        path,
        {
            "server": {"host": "127.0.0.1", "port": free_port()},
            "admin": {"port": free_port()},
            "webhook": {"secrets": [SECRET]},
            "api": {"base_url": upstream.base_url, "api_key": API_KEY},
            "store": {"url": "sqlite:///inbox.db"},
            "worker": {"poll_interval_seconds": 0.1},
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


async def test_intake_stores_and_a_separate_worker_processes(tmp_path, upstream):
    intake = ReceiverProcess(config(tmp_path / "intake.toml", upstream), role="intake")
    worker = ReceiverProcess(config(tmp_path / "worker.toml", upstream), role="worker")
    intake.start()
    try:
        await intake.wait_ready()
        payloads = [upstream.add_job("image") for _ in range(3)]
        url = f"http://127.0.0.1:{intake.public_port}/webhooks"
        for payload in payloads:
            assert await post_webhook(url, SECRET, payload) == 200
        # Stored, not processed: nobody has asked the upstream anything.
        assert upstream.requests["GET /v1/jobs/{id}"] == 0

        worker.start()
        await worker.wait_ready()
        # The worker has no public listener.
        with pytest.raises(aiohttp.ClientConnectionError):
            await post_webhook(
                f"http://127.0.0.1:{worker.public_port}/webhooks", SECRET, payloads[0]
            )

        expected = expected_files(upstream, payloads)
        assert expected  # some of the shaped webhooks name files

        async def processed():
            root = tmp_path / "downloads"
            return {p.relative_to(root).as_posix() for p in root.rglob("*.png")} == expected

        await wait_for(processed, timeout=20, what="the worker to write every file")
        assert "Traceback" not in intake.log() + worker.log()
    finally:
        intake.stop()
        worker.stop()
