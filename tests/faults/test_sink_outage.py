"""Sink outage and recovery: the download sink's file host answers 503, first always, then half
the time, then recovers. The backlog drains, every file lands once, and the duplicate downloads
(files fetched again because another file of the same event failed) are counted and reported.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from receiver.app import Runtime
from receiver.sinks.download import DownloadSink
from tests.support.expect import expected_files
from tests.support.faults import API_KEY, SECRET, final_files, signed_post
from tests.support.helpers import wait_for
from tests.support.pipeline import download_settings
from tests.support.upstream import serve_upstream

EVENTS = 40


class Outage:
    """A middleware answering 503 to that fraction of file downloads."""

    def __init__(self) -> None:
        self.fraction = 0.0
        self.refused = 0
        self.random = random.Random(7)

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path.startswith("/files/") and self.random.random() < self.fraction:
            self.refused += 1
            return web.Response(status=503, text="the file host is down")
        return await handler(request)


async def test_download_sink_outage_drains_the_backlog_after_recovery(
    aiohttp_client: Any, aiohttp_server: Any, tmp_path: Path, record_property: Any
) -> None:
    outage = Outage()
    sim = await serve_upstream(
        aiohttp_server, api_key=API_KEY, seed=31, middlewares=[outage.middleware]
    )
    settings = download_settings(
        sim,
        tmp_path,
        secret=SECRET,
        api_key=API_KEY,
        worker={
            "concurrency": 8,
            "max_attempts": 1000,
            "backoff_max_seconds": 0.4,
            # Failures open the sink's circuit: its lane pauses, then probes (short here).
            "circuit_pause_seconds": 0.2,
        },
    )
    payloads = [sim.add_job("image") for _ in range(EVENTS)]
    async with Runtime(settings) as runtime:
        client = await aiohttp_client(runtime.public_app())
        outage.fraction = 1.0
        for payload in payloads:
            body, headers = signed_post(payload)
            assert (await client.post("/webhooks", data=body, headers=headers)).status == 200
        await asyncio.sleep(1.5)
        # Nothing with a file got through while it was down (a job that names no file has
        # nothing to download, and may be done if the lane's circuit let it through).
        with_files = [p for p in payloads if expected_files(sim, [p])]
        assert len(with_files) > EVENTS // 2
        for payload in with_files:
            record = await runtime.store.get(payload["id"])
            assert record is not None and record.state == "pending"
        assert final_files(tmp_path / "dl") == set()
        outage.fraction = 0.5
        await asyncio.sleep(1.0)
        outage.fraction = 0.0

        async def drained() -> bool:
            counts, _ = await runtime.store.counts()
            return counts == {"pending": 0, "done": EVENTS, "dead": 0}

        await wait_for(drained, 30, 0.05, "the backlog to drain")
        (sink,) = runtime.sinks
        assert isinstance(sink, DownloadSink)
        retries = runtime.metrics.registry.get_sample_value(
            "receiver_sink_deliveries_total", {"sink": "files", "outcome": "retry"}
        )

    expected = expected_files(sim, payloads)
    assert final_files(tmp_path / "dl") == expected
    duplicates = sink.files_written - len(expected)
    record_property("refused_downloads", outage.refused)
    record_property("duplicate_downloads", duplicates)
    print(  # the figure the issue asks to report; shown with pytest -s or -rP
        f"sink outage: {EVENTS} events, {len(expected)} files, {outage.refused} downloads "
        f"refused, {retries:.0f} retried deliveries, {duplicates} duplicate downloads "
        f"({duplicates / len(expected):.0%} of the files)"
    )
    # Deliveries failed during the outage; once the circuit opened, the lane stopped trying
    # each one and probed instead, so not every event had to fail first.
    assert retries and retries >= 5
    # At-least-once costs re-downloads only of files whose event failed on another file: on the
    # order of the files written, never a multiple of them.
    assert 0 <= duplicates <= len(expected)
