"""Graceful shutdown under load: SIGTERM while webhooks are arriving, bodies are half sent and
deliveries are stuck on a slow upstream.

Every request the receiver had accepted is answered (the half-sent ones finish and get their
2xx), every 2xx'd event is in the inbox, no claim is left held, and the process exits 0 within
the drain time (``server.shutdown_timeout_seconds``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp

from receiver.simulator import Simulator
from tests.support.faults import client_session, db_rows, receiver_config, signed_post
from tests.support.helpers import ReceiverProcess

DRAIN = 2.0
HALF_SENT = 8
SENDERS = 4


async def half_sent_request(port: int, payload: dict[str, Any]) -> Any:
    """A connection with the headers and half the body sent; returns a function finishing it."""
    body, headers = signed_post(payload)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = f"POST /webhooks HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
    head += f"Content-Length: {len(body)}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    half = len(body) // 2
    writer.write(head.encode() + body[:half])
    await writer.drain()

    async def finish() -> int:
        writer.write(body[half:])
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
        writer.close()
        return int(status_line.split()[1])

    return finish


async def test_sigterm_under_load(tmp_path: Path, upstream: Simulator) -> None:
    config = receiver_config(tmp_path, upstream, lease=120, drain=DRAIN)
    proc = ReceiverProcess(config)
    url = f"http://127.0.0.1:{proc.public_port}/webhooks"
    acknowledged: list[str] = []
    outcomes: dict[str, int] = {}
    stop_sending = asyncio.Event()

    async def sender(session: aiohttp.ClientSession) -> None:
        while not stop_sending.is_set():
            payload = upstream.add_job("image")
            body, headers = signed_post(payload)
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    outcome = str(response.status)
                    if response.status == 200:
                        acknowledged.append(payload["id"])
            except aiohttp.ClientConnectorError:
                outcome = "refused"  # not accepted: the listener was closed
            except aiohttp.ClientError as exc:
                outcome = type(exc).__name__
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            await asyncio.sleep(0.01)

    proc.start()
    try:
        await proc.wait_ready()
        async with client_session() as session:
            # Deliveries in flight: the upstream takes longer than the whole drain time.
            upstream.latency_seconds = 30
            senders = [asyncio.create_task(sender(session)) for _ in range(SENDERS)]
            await asyncio.sleep(0.5)
            half_sent = [
                await half_sent_request(proc.public_port, upstream.add_job("image"))
                for _ in range(HALF_SENT)
            ]
            # Let the receiver take them (handlers started, bodies awaited): a connection still
            # in the kernel's accept queue when the listener closes was never accepted.
            await asyncio.sleep(0.5)
            assert proc.proc is not None
            started = time.monotonic()
            proc.proc.terminate()
            await asyncio.sleep(0.3)
            statuses = await asyncio.gather(*(finish() for finish in half_sent))
            while proc.proc.poll() is None and time.monotonic() - started < DRAIN + 10:
                await asyncio.sleep(0.05)
            took = time.monotonic() - started
            stop_sending.set()
            await asyncio.gather(*senders)
        upstream.latency_seconds = 0

        assert proc.proc.returncode == 0, proc.log()
        # The drain time, plus what a Python process takes to exit (a loose bound: no timing).
        assert took < DRAIN + 3, f"exit took {took:.1f} s with a drain time of {DRAIN} s"
        # The requests in flight were answered, and answered 2xx: their events are stored.
        assert statuses == [200] * HALF_SENT
        # Others got 2xx before the listener closed, or were refused a connection afterwards:
        # none was cut off with no answer after the receiver had taken it.
        assert set(outcomes) <= {"200", "refused"}, outcomes
        assert outcomes.get("200", 0) > 0
        db = tmp_path / "inbox.db"
        stored = {row[0] for row in db_rows(db, "SELECT id FROM events")}
        assert set(acknowledged) <= stored
        assert len(stored) >= len(acknowledged) + HALF_SENT
        # Deliveries were cut at the drain deadline and their claims released, not left to
        # expire with the 120 s lease.
        assert db_rows(db, "SELECT count(*) FROM events WHERE lease_owner IS NOT NULL") == [(0,)]
        assert db_rows(db, "SELECT count(*) FROM events WHERE state = 'pending'")[0][0] > 0
        assert '"shutting down"' in proc.log()
    finally:
        proc.stop()
