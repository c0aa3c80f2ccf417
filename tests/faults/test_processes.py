"""``receiver serve --processes 2``: two intake processes on one public port (SO_REUSEPORT).

Both take webhooks (each counts its own on its ops listener), SIGTERM to the first stops both,
it exits 0, and every event that got a 2xx is in the inbox."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from receiver.simulator import Simulator
from tests.support.faults import client_session, db_rows, receiver_config, signed_post
from tests.support.helpers import ReceiverProcess, adjacent_free_ports

pytestmark = pytest.mark.skipif(
    not hasattr(socket, "SO_REUSEPORT") or sys.platform != "linux",
    reason="SO_REUSEPORT spreads connections over processes on Linux",
)

EVENTS = 120


@asynccontextmanager
async def two_processes(
    tmp_path: Path, upstream: Simulator
) -> AsyncIterator[tuple[ReceiverProcess, int]]:
    """``receiver serve --processes 2``, both ready; and its first ops port (the second
    process's is the next one)."""
    config = receiver_config(tmp_path, upstream)
    text = config.read_text()
    old_admin = text.split("[admin]\nport = ", 1)[1].split("\n", 1)[0]
    admin = adjacent_free_ports()
    config.write_text(text.replace(f"[admin]\nport = {old_admin}", f"[admin]\nport = {admin}"))
    proc = ReceiverProcess(config, args=("--processes", "2"))
    proc.start()
    try:
        await proc.wait_ready()
        await proc.wait_ready(ops_port=admin + 1)
        yield proc, admin
    finally:
        proc.stop()


async def accepted(session: aiohttp.ClientSession, ops_port: int) -> float:
    async with session.get(f"http://127.0.0.1:{ops_port}/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith('receiver_webhook_requests_total{outcome="accepted"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_two_intake_processes_share_the_port_and_stop_together(
    tmp_path: Path, upstream: Simulator
) -> None:
    async with two_processes(tmp_path, upstream) as (proc, admin):
        url = f"http://127.0.0.1:{proc.public_port}/webhooks"
        payloads = [upstream.add_job("image") for _ in range(EVENTS)]

        # A new connection per request: the kernel picks a process for each.
        async with client_session() as session:

            async def send(payload: dict) -> tuple[str, int]:
                body, headers = signed_post(payload)
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    return payload["id"], response.status

            results = await asyncio.gather(*(send(p) for p in payloads))
            counts = [await accepted(session, port) for port in (admin, admin + 1)]

        assert [status for _, status in results] == [200] * EVENTS
        assert sum(counts) == EVENTS
        assert min(counts) > 0, counts  # both processes took some
        assert proc.terminate(timeout=30) == 0, proc.log()
        stored = {row[0] for row in db_rows(tmp_path / "inbox.db", "SELECT id FROM events")}
        assert stored == {event_id for event_id, _ in results}
        # The second process is gone too: nothing listens on its ops port any more
        # (SO_REUSEADDR: connections of the scrape may linger in TIME_WAIT).
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", admin + 1))
            probe.listen()


def child_pids(proc: ReceiverProcess) -> list[int]:
    for line in proc.log().splitlines():
        if "intake processes started" in line:
            return [int(pid) for pid in json.loads(line)["pids"]]
    raise AssertionError(f"no 'intake processes started' line:\n{proc.log()}")


async def test_an_intake_process_dying_stops_the_set_with_exit_1(
    tmp_path: Path, upstream: Simulator
) -> None:
    async with two_processes(tmp_path, upstream) as (proc, _admin):
        (child,) = child_pids(proc)
        os.kill(child, signal.SIGKILL)
        assert proc.proc is not None
        deadline = time.monotonic() + 30
        while proc.proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert proc.proc.returncode == 1, proc.log()
        assert "an intake process exited; stopping" in proc.log()
