"""A rolling upgrade on Postgres from the previous release, with webhooks flowing throughout.

The contract ("Upgrades, backups, moving stores"): after the new release migrates, replicas of
the previous release still running on the same database keep taking webhooks and delivering
until replaced, and none of their work is lost. Here the previous release is a real install of
its wheel (``tests/data/releases``, in a virtualenv of its own: :mod:`tests.support.releases`)
and each receiver is its own ``receiver serve`` process, as in a Deployment rollout:

1. The previous release serves alone on a fresh schema (its ``auto_migrate`` creates schema
   ``PREVIOUS_SCHEMA``) while a sender posts signed webhooks, each with a new event id, at a
   steady ``RATE`` through a round-robin over the replicas in rotation. Each webhook is posted
   once: any answer but a 2xx, or no answer, counts as refused.
2. This release's ``receiver migrate`` (its console script, like the Kubernetes migrate Job)
   brings the schema to this release's, with the old replica running.
3. This release starts as a second replica on the same schema and joins the rotation. The old
   replica must go on answering webhooks and delivering them (its deliveries carry its own
   ``X-Replica`` header) after the migration, and a redelivery made through its admin API (its
   code writing batches into the migrated tables) is delivered once more, exactly once.
4. The old replica leaves the rotation, then gets SIGTERM (it drains and exits 0); the sender
   goes on with the new replica alone, then stops.

Then every event answered 2xx arrives at the sink exactly once (the redelivered ones twice), the
inbox has every delivery done, neither replica logged an error, and a restart of the previous
release on the migrated inbox is refused without changing it. The figures are printed as one
``rolling upgrade:`` line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from receiver.simulator import Simulator
from receiver.store.postgres.schema import SCHEMA_VERSION
from tests.support.faults import client_session
from tests.support.helpers import ReceiverProcess, free_port, wait_for, write_config
from tests.support.peers import Capture
from tests.support.pipeline import signed
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres
from tests.support.releases import release_venv
from tests.support.upstream import serve_upstream

PREVIOUS = "0.4.0"
PREVIOUS_SCHEMA = 8
SECRET = "whsec_rolling_" + "4d" * 12
API_KEY = "service_" + "a9" * 32
ADMIN_TOKEN = "rolling-upgrade-admin-" + "0b" * 8
RATE = 50  # webhooks a second, whatever the replicas answer
# How much each phase must have seen before the next begins (conditions, not durations).
BEFORE_MIGRATE = 50  # webhooks the old replica answered alone
OLD_AFTER_MIGRATE = 100  # webhooks the old replica answered, sent after the migration ended
OLD_DELIVERED_AFTER = 20  # of those, delivered by the old replica itself
NEW_ALONE = 50  # webhooks the new replica answered after the old one exited


@dataclass
class Answer:
    """One webhook as the sender saw it: posted once, to one replica."""

    replica: str
    sent_at: float  # time.monotonic()
    status: int | None = None  # None: no answer yet, or none at all (``error``)
    error: str = ""


@dataclass
class Replica:
    name: str
    proc: ReceiverProcess
    in_flight: int = 0


class ReleaseProcess(ReceiverProcess):
    """``receiver serve`` of an earlier release: the console script of its own virtualenv."""

    def __init__(self, config: Path, bin_dir: Path) -> None:
        super().__init__(config)
        self.bin_dir = bin_dir

    def start(self, env: dict[str, str] | None = None) -> None:
        clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(self.bin_dir / "receiver"), "serve", "--config", str(self.config)],
                cwd=self.cwd,
                env={**clean, "PYTHONUNBUFFERED": "1", **(env or {})},
                stdout=log,
                stderr=log,
            )


class Sender:
    """Posts a new signed webhook ``RATE`` times a second to the replicas in ``rotation``,
    each in turn, until stopped; records every answer."""

    def __init__(self, session: aiohttp.ClientSession, upstream: Simulator) -> None:
        self.session = session
        self.upstream = upstream
        self.rotation: list[Replica] = []
        self.answers: dict[str, Answer] = {}
        self.jobs: dict[str, str] = {}  # event id -> job id
        self._stop = asyncio.Event()
        self._posts: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        started = time.monotonic()
        sent = 0
        while not self._stop.is_set():
            replica = self.rotation[sent % len(self.rotation)]
            # Counted in flight from now, not from when the task first runs: a replica taken
            # out of the rotation is stopped once none is in flight, and a task created just
            # before may not have started yet (on a loaded machine, several of them).
            replica.in_flight += 1
            task = asyncio.create_task(self._post(replica, self.upstream.add_job("image")))
            self._posts.add(task)
            task.add_done_callback(self._posts.discard)
            sent += 1
            pause = started + sent / RATE - time.monotonic()
            if pause > 0:  # the pace of the sender, not a wait for the receivers
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), pause)
        if self._posts:
            await asyncio.gather(*self._posts)

    def stop(self) -> None:
        self._stop.set()

    async def _post(self, replica: Replica, payload: dict[str, Any]) -> None:
        """Post ``payload`` to ``replica`` (counted in flight by :meth:`run`, until answered)."""
        answer = Answer(replica.name, time.monotonic())
        self.answers[payload["id"]] = answer
        self.jobs[payload["id"]] = payload["job_id"]
        url = f"http://127.0.0.1:{replica.proc.public_port}/webhooks"
        try:
            body, headers = signed(payload, SECRET)
            async with self.session.post(url, data=body, headers=headers) as response:
                await response.read()
                answer.status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            answer.error = repr(exc)
        finally:
            replica.in_flight -= 1

    def accepted(self, replica: str | None = None, since: float = 0.0) -> list[str]:
        """Event ids answered 2xx (by ``replica``, posted at ``since`` or later)."""
        return [
            event_id
            for event_id, a in self.answers.items()
            if a.status is not None
            and 200 <= a.status < 300
            and (replica is None or a.replica == replica)
            and a.sent_at >= since
        ]

    def refused(self) -> list[str]:
        return [
            f"{event_id} at {a.replica}: {a.status if a.status is not None else a.error}"
            for event_id, a in self.answers.items()
            if a.error or (a.status is not None and not 200 <= a.status < 300)
        ]


@dataclass
class Sink:
    """What the http sink's capture server received: (event id, replica, arrival time)."""

    capture: Capture
    seen: list[tuple[str, str, float]] = field(default_factory=list)

    def update(self) -> list[tuple[str, str, float]]:
        requests = self.capture.requests
        for request, arrived in zip(
            requests[len(self.seen) :], self.capture.times[len(self.seen) :], strict=False
        ):
            replica = {k.lower(): v for k, v in request.headers.items()}.get("x-replica", "?")
            self.seen.append((json.loads(request.body)["event"]["id"], replica, arrived))
        return self.seen

    def counts(self) -> Counter[str]:
        return Counter(event_id for event_id, _, _ in self.update())


def config(
    home: Path, name: str, upstream: Simulator, capture: Capture, schema: str, **store: Any
) -> Path:
    """A replica's config, in the format both releases read; its deliveries carry its name."""
    home.mkdir()
    assert upstream.base_url is not None
    return write_config(
        home / "config.toml",
        {
            "server": {"host": "127.0.0.1", "port": free_port(), "shutdown_timeout_seconds": 5},
            "admin": {"port": free_port(), "token": ADMIN_TOKEN},
            "webhook": {"secrets": [SECRET]},
            "api": {"base_url": upstream.base_url, "api_key": API_KEY, "timeout_seconds": 10},
            "store": {"url": POSTGRES_URL, "schema": schema, "pool_size": 4, **store},
            "worker": {
                "lease_seconds": 10,
                "poll_interval_seconds": 0.5,
                "backoff_initial_seconds": 0.1,
                "backoff_max_seconds": 0.5,
            },
            "log": {"format": "json", "level": "info"},
            "sinks": [
                {
                    "name": "hook",
                    "type": "http",
                    "url": capture.url,
                    "secret": "k" * 24,
                    "headers": {"X-Replica": name},
                }
            ],
        },
    )


def errors_logged(proc: ReceiverProcess) -> list[str]:
    """The lines of the process's log at level error or above, and any traceback."""
    bad = []
    for line in proc.log().splitlines():
        try:
            level = json.loads(line).get("level", "")
        except ValueError:
            level = ""
        if level in ("error", "critical", "exception") or "Traceback" in line:
            bad.append(line)
    return bad


async def run_command(*argv: str | Path, timeout: float = 60) -> tuple[int, str, str]:
    """Run a command to its end: (exit code, stdout, stderr); killed if it outlasts
    ``timeout`` (then the wait raises)."""
    proc = await asyncio.create_subprocess_exec(
        *map(str, argv), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def schema_version(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT max(version) FROM receiver_schema_migrations"))


async def admin(
    session: aiohttp.ClientSession, proc: ReceiverProcess, method: str, path: str, **kw: Any
) -> tuple[int, Any]:
    url = f"http://127.0.0.1:{proc.ops_port}{path}"
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with session.request(method, url, headers=headers, **kw) as response:
        return response.status, await response.json()


@pytest.fixture
async def schema():
    require_postgres()
    async with fresh_schema() as name:
        yield name


@pytest.mark.slow  # two releases side by side on one schema: 30 s and more
@pytest.mark.timeout(300)  # the first run installs the previous release (see releases.py)
async def test_rolling_upgrade_from_the_previous_release_loses_and_repeats_nothing(
    tmp_path, aiohttp_server, schema, capsys
):
    previous_bin = release_venv(PREVIOUS)
    upstream = await serve_upstream(aiohttp_server, api_key=API_KEY, seed=40)
    capture = Capture()
    capture.url = str((await aiohttp_server(capture.app())).make_url("/in"))
    sink = Sink(capture)
    old_config = config(tmp_path / "old", PREVIOUS, upstream, capture, schema)
    new_config = config(tmp_path / "new", "current", upstream, capture, schema, auto_migrate=False)
    old = Replica(PREVIOUS, ReleaseProcess(old_config, previous_bin))
    new = Replica("current", ReceiverProcess(new_config))
    figures: dict[str, Any] = {}
    t0 = time.monotonic()

    db = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
    try:
        async with client_session() as session:
            old.proc.start()
            await old.proc.wait_ready()
            assert await schema_version(db) == PREVIOUS_SCHEMA
            sender = Sender(session, upstream)
            sender.rotation.append(old)
            sending = asyncio.create_task(sender.run())
            try:
                # -- 1. the previous release alone
                async def old_alone() -> bool:
                    delivered = {e for e, _, _ in sink.update()}
                    return len(delivered & set(sender.accepted(PREVIOUS))) >= BEFORE_MIGRATE

                await wait_for(old_alone, 20, 0.05, "the old replica to deliver on its own")

                # -- 2. this release's `receiver migrate`, the old replica serving
                code, out, err = await run_command(
                    Path(sys.executable).parent / "receiver", "migrate", "--config", new_config
                )
                migrated_at = time.monotonic()
                assert code == 0, err
                assert await schema_version(db) == SCHEMA_VERSION
                figures["migrate"] = out.strip()

                # -- 3. this release joins; the old replica goes on, also for a redelivery
                new.proc.start()
                await new.proc.wait_ready()
                sender.rotation.append(new)
                status, _ = await admin(session, old.proc, "GET", "/readyz")
                assert status == 200

                # Two events the old replica delivered before the migration, recorded done.
                before = [e for e, r, t in sink.update() if r == PREVIOUS and t < migrated_at]
                again = await db.fetchval(
                    "SELECT array_agg(event_id) FROM (SELECT event_id FROM deliveries "
                    "WHERE state = 'done' AND event_id = ANY($1::text[]) "
                    "ORDER BY updated_at LIMIT 2) d",
                    before,
                )
                assert len(again) == 2
                status, body = await admin(
                    session, old.proc, "POST", f"/admin/events/{again[0]}/redeliver"
                )
                assert status in (200, 202), body
                batches = [body["data"]["batch"]]
                status, body = await admin(
                    session,
                    old.proc,
                    "POST",
                    "/admin/redeliveries",
                    json={"job_id": sender.jobs[again[1]], "status": "any"},
                )
                assert status == 202, body
                assert body["matched"] == 1
                batches.append(body["id"])

                async def old_serves_after_migration() -> bool:
                    taken = set(sender.accepted(PREVIOUS, since=migrated_at))
                    own = {e for e, r, t in sink.update() if r == PREVIOUS and t > migrated_at}
                    figures["old answered after migrate"] = len(taken)
                    figures["old delivered after migrate"] = len(own)
                    return (
                        len(taken) >= OLD_AFTER_MIGRATE and len(taken & own) >= OLD_DELIVERED_AFTER
                    )

                await wait_for(
                    old_serves_after_migration,
                    30,
                    0.05,
                    "the old replica to take and deliver webhooks after the migration",
                )

                # -- 4. the old replica is replaced
                sender.rotation.remove(old)

                async def old_answered_all() -> bool:
                    return old.in_flight == 0

                await wait_for(old_answered_all, 15, 0.02, "the old replica's last answers")
                assert old.proc.proc is not None
                old.proc.proc.send_signal(signal.SIGTERM)
                assert await asyncio.to_thread(old.proc.proc.wait, 20) == 0
                old_gone = time.monotonic()

                async def new_alone() -> bool:
                    return len(sender.accepted("current", since=old_gone)) >= NEW_ALONE

                await wait_for(new_alone, 20, 0.05, "the new replica to take webhooks alone")
            finally:
                sender.stop()
                await sending
            figures["send seconds"] = round(time.monotonic() - t0, 1)

            # -- every webhook answered 2xx, every event delivered once (redeliveries twice)
            assert sender.refused() == []
            accepted = set(sender.accepted())
            assert len(accepted) == len(sender.answers)

            async def all_delivered() -> bool:
                waiting = await db.fetchval(
                    "SELECT count(*) FROM deliveries WHERE state <> 'done' OR lease_owner IS "
                    "NOT NULL"
                )
                running = await db.fetchval(
                    "SELECT count(*) FROM redeliveries WHERE state = 'running'"
                )
                return waiting == 0 and running == 0 and accepted <= set(sink.counts())

            await wait_for(all_delivered, 30, 0.1, "every event to be delivered")
            counts = sink.counts()
            expected = Counter({event_id: 1 for event_id in accepted})
            expected.update(again)
            assert set(counts) == set(expected), "events lost, or delivered that were never sent"
            assert {e: n for e, n in counts.items() if n != expected[e]} == {}
            rows = await db.fetch("SELECT id, state FROM events")
            assert {r["id"] for r in rows} == accepted
            assert {r["state"] for r in rows} == {"done"}
            for batch in batches:  # this release reads what the old one wrote
                status, body = await admin(session, new.proc, "GET", f"/admin/redeliveries/{batch}")
                assert status == 200, body
                assert (body["state"], body["matched"], body["delivered"]) == ("done", 1, 1)
                assert body["withdrawn"] == 0

            assert errors_logged(old.proc) == []
            assert errors_logged(new.proc) == []

            # -- the previous release, started again, refuses the migrated inbox
            code, _, err = await run_command(
                previous_bin / "receiver", "serve", "--config", old_config, timeout=30
            )
            assert code == 2, err
            assert f"knows up to version {PREVIOUS_SCHEMA}" in err
            assert await schema_version(db) == SCHEMA_VERSION
    finally:
        await db.close()
        new.proc.stop()
        old.proc.stop()

    by_replica = Counter(a.replica for a in sender.answers.values())
    delivered_by = Counter(r for _, r, _ in sink.seen)
    figures["answered"] = dict(by_replica)
    figures["delivered by"] = dict(delivered_by)
    figures["seconds"] = round(time.monotonic() - t0, 1)
    with capsys.disabled():
        print(f"\nrolling upgrade: {figures}")
