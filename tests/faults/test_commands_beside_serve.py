"""kill -9 of a SQLite receiver while operator commands run beside it: no 2xx is ever lost.

Webhooks flow into ``receiver serve`` (its own OS process) while other processes run the
commands an operator runs against the same inbox, reads and writes of each kind (``events list``,
``events show``, ``lanes``, ``lanes pause``/``resume``, ``events redeliver``, ``redeliver``,
``redeliver status``, ``watch``). At a random moment the server is killed with SIGKILL and
started again: every event it answered 2xx for is in the inbox, and ``PRAGMA integrity_check``
says ``ok``.

A command's process closing its connections must never make SQLite believe it was the last one
on the file (it would delete the WAL the server still writes into, and every later commit of the
server would go to a file nobody reads again). ``make test-durability`` runs it
``RECEIVER_DURABILITY_RUNS`` times (20); the suite runs it once.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import aiohttp
import pytest

from receiver.simulator import Simulator
from tests.support.cli import run_cli
from tests.support.faults import client_session, db_rows, receiver_config, signed_post
from tests.support.helpers import ReceiverProcess

RUNS = int(os.environ.get("RECEIVER_DURABILITY_RUNS", "1"))
SENDERS = 3


def commands(event_id: str, job_id: str) -> list[tuple[str, ...]]:
    """Each kind of command an operator runs beside the server, reads and writes."""
    return [
        ("events", "list", "--limit", "5"),
        ("lanes", "pause", "files", "--reason", "drill"),
        ("events", "show", event_id),
        ("lanes", "resume", "files"),
        ("events", "redeliver", event_id),
        ("lanes",),
        ("redeliver", "--status", "done", "--sink", "files", "--detach"),
        ("redeliver", "status"),
        ("watch", job_id),
        ("events", "redeliver", "--dead"),
    ]


def integrity(db: Path) -> str:
    return "\n".join(str(row[0]) for row in db_rows(db, "PRAGMA integrity_check"))


@pytest.mark.parametrize("run", range(RUNS))
async def test_sigkill_beside_commands_loses_no_acknowledged_event(
    tmp_path: Path, upstream: Simulator, run: int
) -> None:
    rng = random.Random(1000 + run)
    config = receiver_config(tmp_path, upstream)
    proc = ReceiverProcess(config)
    url = f"http://127.0.0.1:{proc.public_port}/webhooks"
    acked: list[str] = []
    killed = asyncio.Event()

    async def sender(session: aiohttp.ClientSession) -> None:
        while not killed.is_set():
            payload = upstream.add_job("image")
            body, headers = signed_post(payload)
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    if 200 <= response.status < 300:
                        acked.append(payload["id"])
            except (aiohttp.ClientError, TimeoutError):
                await asyncio.sleep(0.05)

    async def operator() -> None:
        while not acked:
            await asyncio.sleep(0.05)
        unwatched = upstream.add_job("image", webhook=False)["job_id"]
        for command in commands(acked[0], unwatched):
            if killed.is_set():
                break
            code, _out, err = await run_cli(*command, "--config", str(config), cwd=tmp_path)
            assert code == 0, (command, err)

    proc.start()
    try:
        await proc.wait_ready()
        async with client_session() as session:
            senders = [asyncio.create_task(sender(session)) for _ in range(SENDERS)]
            commands_task = asyncio.create_task(operator())
            # Commands run for a while (the server checkpoints every second meanwhile), then
            # the server dies at a random moment among them.
            await asyncio.sleep(rng.uniform(5.0, 8.0))
            proc.kill()
            killed.set()
            await asyncio.gather(*senders)
            # The command under way when the server died ends on its own (the commands use the
            # inbox file, not the server); no more start.
            await commands_task

        db = tmp_path / "inbox.db"
        assert integrity(db) == "ok"
        proc.start()
        await proc.wait_ready()
        stored = {row[0] for row in db_rows(db, "SELECT id FROM events")}
        lost = [event_id for event_id in acked if event_id not in stored]
        assert len(acked) > 50
        assert not lost, f"{len(lost)} of {len(acked)} events answered 2xx are not in the inbox"
        assert integrity(db) == "ok"
    finally:
        proc.stop()
