"""Three real ``receiver serve`` processes on one Postgres inbox, one of them SIGKILLed midway.

Every event is sent to two different replicas (the cross-replica duplicates a load balancer and
the upstream's retries produce); replica 0 is killed while it holds claims and started again.
Afterwards every event is processed, the inbox has exactly one row per event id and one
delivery row per (event, sink), none dead, and the download sink (idempotent: a redelivery
rewrites the same files) holds exactly one file set per event and nothing else. The figures
are printed as one ``replicas:`` line.
"""

import asyncio
import json
import re
import time
from collections import Counter

import aiohttp
import asyncpg
import pytest

from receiver.signature import webhook_headers
from tests.support.expect import expected_files
from tests.support.helpers import ReceiverProcess, free_port, wait_for, write_config
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres, url_with
from tests.support.upstream import serve_upstream

SECRET = "whsec_replicas"
API_KEY = "service_" + "7a" * 32
REPLICAS = 3
EVENTS = 1000
KILL_AFTER = EVENTS // 2
IN_FLIGHT = 24  # events being sent at once (each to two replicas)


@pytest.fixture
async def upstream(aiohttp_server):
    return await serve_upstream(aiohttp_server, api_key=API_KEY, seed=17)


@pytest.fixture
async def schema():
    require_postgres()
    async with fresh_schema() as name:
        yield name


def replica_config(tmp_path, n, upstream, schema):
    home = tmp_path / f"replica-{n}"
    home.mkdir()
    return write_config(
        home / "config.toml",
        {
            "server": {"host": "127.0.0.1", "port": free_port(), "shutdown_timeout_seconds": 2},
            "admin": {"port": free_port()},
            "webhook": {"secrets": [SECRET]},
            "api": {"base_url": upstream.base_url, "api_key": API_KEY, "timeout_seconds": 10},
            "store": {
                "url": url_with(application_name=f"receiver-replica-{n}"),
                "schema": schema,
                "pool_size": 4,
                "timeout_seconds": 10,
            },
            "worker": {
                "concurrency": 8,
                "lease_seconds": 5,
                "poll_interval_seconds": 1.0,  # LISTEN/NOTIFY wakes idle workers sooner
                "backoff_initial_seconds": 0.1,
                "backoff_max_seconds": 1.0,
            },
            "log": {"format": "json", "level": "warning"},
            "sinks": [
                {
                    "name": "files",
                    "type": "download",
                    "directory": str(tmp_path / "downloads"),
                    "allow_private_networks": True,
                }
            ],
        },
    )


async def deliveries_by_replica(session, proc):
    """Successful deliveries this process counted since it started (its /metrics)."""
    async with session.get(f"http://127.0.0.1:{proc.ops_port}/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith("receiver_sink_deliveries_total{") and 'outcome="success"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


@pytest.mark.slow  # three receivers, one killed, every event counted: 20 s and more
async def test_three_replicas_one_killed_every_event_processed_once(
    tmp_path, upstream, schema, capsys
):
    procs = [
        ReceiverProcess(replica_config(tmp_path, n, upstream, schema)) for n in range(REPLICAS)
    ]
    payloads = [upstream.add_job("image") for _ in range(EVENTS)]
    statuses: Counter[str] = Counter()
    acknowledged: Counter[str] = Counter()
    alive = [True] * REPLICAS
    figures: dict[str, object] = {}
    started = time.monotonic()
    for proc in procs:
        proc.start()  # together: they race to migrate the fresh schema
    try:
        await asyncio.gather(*(proc.wait_ready(timeout=60) for proc in procs))
        db = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
        try:
            async with aiohttp.ClientSession() as session:
                slots = asyncio.Semaphore(IN_FLIGHT)
                sent = 0

                async def post(n, payload):
                    body = json.dumps(payload).encode()
                    headers = webhook_headers(
                        SECRET,
                        body,
                        int(time.time()),
                        event_id=payload["id"],
                        event_name=payload["event"],
                    )
                    url = f"http://127.0.0.1:{procs[n].public_port}/webhooks"
                    try:
                        async with session.post(url, data=body, headers=headers) as response:
                            answer = await response.read()
                            status = response.status
                    except aiohttp.ClientError:
                        statuses["no answer (replica down)"] += 1
                        return False
                    statuses[str(status)] += 1
                    if status != 200:
                        return False
                    duplicate = json.loads(answer)["duplicate"]
                    acknowledged["duplicate" if duplicate else "new"] += 1
                    return True

                async def send(i, payload):
                    nonlocal sent
                    pair = (i % REPLICAS, (i + 1 + (i // REPLICAS) % 2) % REPLICAS)
                    async with slots:
                        results = await asyncio.gather(*(post(n, payload) for n in pair))
                        # Like the upstream: retry a refused event until some replica takes it.
                        n = pair[0]
                        while not any(results):
                            await asyncio.sleep(0.2)
                            n = (n + 1) % REPLICAS
                            if alive[n]:
                                results = [await post(n, payload)]
                        sent += 1

                async def kill_and_restart():
                    async def halfway():
                        return sent >= KILL_AFTER

                    await wait_for(halfway, timeout=60, what="half the events sent")
                    pid = procs[0].proc.pid

                    async def holding_claims():
                        owned = await db.fetchval(
                            "SELECT count(*) FROM events WHERE lease_owner LIKE $1",
                            f"%:{pid}:%",
                        )
                        figures["claims held by the killed replica"] = owned
                        return owned > 0

                    await wait_for(holding_claims, timeout=30, interval=0.01, what="claims")
                    alive[0] = False
                    procs[0].kill()
                    figures["killed after events sent"] = sent
                    await asyncio.sleep(1.0)
                    procs[0].start()
                    await procs[0].wait_ready(timeout=60)
                    alive[0] = True

                send_started = time.monotonic()
                await asyncio.gather(
                    kill_and_restart(), *(send(i, p) for i, p in enumerate(payloads))
                )
                figures["send seconds"] = round(time.monotonic() - send_started, 1)

                async def all_processed():
                    done = await db.fetchval("SELECT count(*) FROM events WHERE state <> 'pending'")
                    return done == EVENTS

                await wait_for(all_processed, timeout=90, interval=0.2, what="every event")
                figures["seconds to all processed"] = round(time.monotonic() - send_started, 1)
                by_replica = [await deliveries_by_replica(session, p) for p in procs]

            # -- the inbox: one row per event id, one delivery per (event, sink), none dead
            rows = await db.fetch("SELECT id, state FROM events")
            assert len(rows) == EVENTS
            assert {r["id"] for r in rows} == {p["id"] for p in payloads}
            assert Counter(r["state"] for r in rows) == {"done": EVENTS}
            deliveries = await db.fetch("SELECT event_id, sink, state, attempts FROM deliveries")
            assert len(deliveries) == EVENTS
            assert len({(d["event_id"], d["sink"]) for d in deliveries}) == EVENTS
            assert Counter(d["state"] for d in deliveries) == {"done": EVENTS}
            retried = sum(d["attempts"] > 1 for d in deliveries)
        finally:
            await db.close()

        # -- every event acknowledged, cross-replica duplicates acknowledged as such
        assert set(statuses) <= {"200", "no answer (replica down)"}, statuses
        assert acknowledged["new"] <= EVENTS
        assert sum(acknowledged.values()) >= EVENTS

        # -- the idempotent sink: exactly one file set per event, nothing else
        downloads = tmp_path / "downloads"
        files = {p.relative_to(downloads).as_posix() for p in downloads.rglob("*") if p.is_file()}
        temp_leftovers = {f for f in files if re.search(r"(^|/)\.[^/]*\.tmp-[0-9a-f]+$", f)}
        expected = expected_files(upstream, payloads)
        assert files - temp_leftovers == expected and len(expected) > EVENTS

        job_fetches = upstream.requests["GET /v1/jobs/{id}"]
        file_fetches = upstream.requests["GET /files/{name}"]
        figures.update(
            {
                "events": EVENTS,
                "webhooks posted": sum(statuses.values()),
                "answers": dict(statuses),
                "acknowledged new/duplicate": f"{acknowledged['new']}/{acknowledged['duplicate']}",
                "inbox rows": len(rows),
                "deliveries done/dead": f"{len(deliveries)}/0",
                "successful deliveries per replica (0 after restart)": by_replica,
                "events processed more than once": job_fetches - EVENTS,
                "files downloaded again": file_fetches - len(expected),
                "deliveries retried": retried,
                "temp files left by the kill": len(temp_leftovers),
                "total seconds": round(time.monotonic() - started, 1),
            }
        )
    finally:
        for proc in procs:
            proc.stop()
    summary = "; ".join(f"{k}: {v}" for k, v in figures.items())
    with capsys.disabled():  # shown in every run: the figures quoted in the docs
        print(f"\nreplicas: {summary}")
