"""kill -9 under load: a sender posting like the upstream, a receiver crashing again and again.

Every event that got a 2xx is processed, with exactly one file set in the download sink and no
delivery lost, whatever moment the process died at: random SIGKILLs, and the two moments a random
kill rarely hits, made certain with ``RECEIVER_FAULT_INJECT`` (see receiver/faults.py). The
first two tests also run with a paced chat sink and a hanging http sink beside the download sink
(and an http consumer): the fast sinks still get every event, and the slow ones lose none.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import aiohttp

from receiver.faults import ENV_VAR, EXIT_CODE
from receiver.simulator import Simulator
from tests.support.expect import expected_files
from tests.support.faults import (
    SlowPeers,
    client_session,
    db_rows,
    final_files,
    post_until_2xx,
    receiver_config,
    signed_post,
    temporary_files,
)
from tests.support.helpers import ReceiverProcess, wait_for

SENDERS = 3
SEND_PAUSE = 0.15
RANDOM_KILLS = 5


async def all_processed(db: Path, count: int, timeout: float = 60.0) -> None:
    async def check() -> bool:
        rows = db_rows(db, "SELECT state, count(*) FROM events GROUP BY state")
        return dict(rows) == {"done": count}

    await wait_for(check, timeout, 0.2, f"{count} events processed")


FAST_SINKS = ("files", "consumer")


async def fast_sinks_done(db: Path, count: int, timeout: float = 60.0) -> None:
    """Every delivery to the download sink and the consumer done (the slow ones still going)."""

    async def check() -> bool:
        rows = db_rows(
            db, "SELECT sink, count(*) FROM deliveries WHERE state = 'done' GROUP BY sink"
        )
        return all(dict(rows).get(sink) == count for sink in FAST_SINKS)

    await wait_for(check, timeout, 0.2, f"{count} events at the fast sinks")


async def processed(db: Path, count: int, slow_peers: SlowPeers | None) -> None:
    """Every event processed: by every sink, or with slow sinks beside, by the fast ones."""
    if slow_peers is None:
        await all_processed(db, count)
        return
    await fast_sinks_done(db, count)
    # The slow sinks lost nothing either: one delivery each per event, none given up.
    rows = db_rows(db, "SELECT sink, state, count(*) FROM deliveries GROUP BY sink, state")
    by_sink: dict[str, int] = {}
    for sink, state, n in rows:
        assert state != "dead", (sink, state, n)
        by_sink[sink] = by_sink.get(sink, 0) + n
    assert by_sink == {"files": count, "consumer": count, "chat": count, "stuck": count}


async def wait_exit(proc: ReceiverProcess, timeout: float = 30.0) -> int:
    assert proc.proc is not None
    deadline = time.monotonic() + timeout
    while proc.proc.poll() is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"the receiver did not crash at the fault point:\n{proc.log()}")
        await asyncio.sleep(0.05)
    return proc.proc.returncode


async def test_sigkill_at_random_moments_under_load_loses_nothing(
    tmp_path: Path, upstream: Simulator, slow_peers: SlowPeers | None
) -> None:
    proc = ReceiverProcess(receiver_config(tmp_path, upstream, slow_peers=slow_peers))
    url = f"http://127.0.0.1:{proc.public_port}/webhooks"
    rng = random.Random(5)
    sent: list[dict[str, Any]] = []
    answers: list[dict[str, Any]] = []
    chaos_over = asyncio.Event()

    async def sender(session: aiohttp.ClientSession) -> None:
        while not chaos_over.is_set():
            payload = upstream.add_job("image")
            sent.append(payload)
            answers.append(await post_until_2xx(session, url, payload))
            await asyncio.sleep(SEND_PAUSE)

    crashes: list[str] = []
    proc.start(env={ENV_VAR: "after_commit:7"})
    try:
        async with client_session() as session:
            senders = [asyncio.create_task(sender(session)) for _ in range(SENDERS)]
            # Two crashes at exact points, under the senders' load...
            for point in ("after_commit:7", "after_sink_success:3"):
                if point != "after_commit:7":
                    proc.start(env={ENV_VAR: point})
                assert await wait_exit(proc) == EXIT_CODE
                crashes.append(point)
            # ... then SIGKILLs at random moments, each after the receiver came back.
            for _ in range(RANDOM_KILLS):
                proc.start()
                await proc.wait_ready()
                await asyncio.sleep(rng.uniform(0.2, 1.5))
                proc.kill()
                crashes.append("SIGKILL")
            proc.start()
            await proc.wait_ready()
            chaos_over.set()
            await asyncio.gather(*senders)

        db = tmp_path / "inbox.db"
        await processed(db, len(sent), slow_peers)
        log = proc.log()
        assert "fault injected: after_commit" in log
        assert "fault injected: after_sink_success" in log
        assert len(crashes) == 2 + RANDOM_KILLS
        assert len(answers) == len(sent) > 20
        # A retry of an event that was committed before its answer was lost is a duplicate.
        assert any(a["duplicate"] for a in answers), "no retry was deduplicated"
        # Every delivery done, exactly one file set per event: nothing lost, nothing extra.
        if slow_peers is None:
            assert db_rows(db, "SELECT count(*) FROM deliveries WHERE state != 'done'") == [(0,)]
        else:
            consumed = {json.loads(r.body)["event"]["id"] for r in slow_peers.consumer.requests}
            assert consumed == {p["id"] for p in sent}
        assert db_rows(db, "SELECT count(*) FROM events") == [(len(sent),)]
        downloads = tmp_path / "downloads"
        assert final_files(downloads) == expected_files(upstream, sent)
        # A kill in the middle of a download can leave its temporary file, never a final one.
        assert len(temporary_files(downloads)) <= len(crashes)
    finally:
        proc.stop()


async def test_crash_between_commit_and_response_the_retry_is_a_duplicate(
    tmp_path: Path, upstream: Simulator, slow_peers: SlowPeers | None
) -> None:
    proc = ReceiverProcess(receiver_config(tmp_path, upstream, slow_peers=slow_peers))
    url = f"http://127.0.0.1:{proc.public_port}/webhooks"
    payload = upstream.add_job("image")
    proc.start(env={ENV_VAR: "after_commit"})
    try:
        await proc.wait_ready()
        body, headers = signed_post(payload)
        async with client_session() as session:
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    raise AssertionError(f"answered {response.status} after the crash point")
            except aiohttp.ClientError:
                pass  # the connection died with the process: no answer, as intended
            assert await wait_exit(proc) == EXIT_CODE
            # The event is on disk although nobody was told.
            assert db_rows(tmp_path / "inbox.db", "SELECT id FROM events") == [(payload["id"],)]

            proc.start()
            await proc.wait_ready()
            answer = await post_until_2xx(session, url, payload)
        assert answer["duplicate"] is True
        await processed(tmp_path / "inbox.db", 1, slow_peers)
        assert final_files(tmp_path / "downloads") == expected_files(upstream, [payload])
    finally:
        proc.stop()


async def test_crash_between_sink_success_and_settle_redelivers_harmlessly(
    tmp_path: Path, upstream: Simulator
) -> None:
    proc = ReceiverProcess(receiver_config(tmp_path, upstream))
    url = f"http://127.0.0.1:{proc.public_port}/webhooks"
    payload = upstream.add_job("image")
    downloads = tmp_path / "downloads"
    proc.start(env={ENV_VAR: "after_sink_success"})
    try:
        await proc.wait_ready()
        async with client_session() as session:
            await post_until_2xx(session, url, payload)
        assert await wait_exit(proc) == EXIT_CODE
        # Delivered, but not recorded as delivered.
        expected = expected_files(upstream, [payload])
        assert final_files(downloads) == expected
        first = {name: (downloads / name).stat().st_ino for name in expected}
        contents = {name: (downloads / name).read_bytes() for name in expected}
        state = db_rows(tmp_path / "inbox.db", "SELECT state, attempts FROM deliveries")
        assert state == [("pending", 0)]

        proc.start()
        await proc.wait_ready()
        await all_processed(tmp_path / "inbox.db", 1)
        # Delivered again (each file replaced by a new one) and nothing else changed.
        assert final_files(downloads) == expected
        assert all((downloads / n).stat().st_ino != ino for n, ino in first.items())
        assert all((downloads / n).read_bytes() == data for n, data in contents.items())
        assert db_rows(tmp_path / "inbox.db", "SELECT state, attempts FROM deliveries") == [
            ("done", 1)
        ]
        events = [json.loads(line) for line in proc.log().splitlines() if line.startswith("{")]
        assert sum(1 for e in events if e.get("event") == "delivered") == 1
    finally:
        proc.stop()
