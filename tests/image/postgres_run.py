"""Two containers on one Postgres inbox, wired as deploy/kubernetes-postgres wires its pods.

Its ConfigMap's config.toml, mounted read-only in both (each on its own free ports: they share
the host's network), secrets and the store URL from the environment as its Secret gives them,
its migrate Job's command run first, and one downloads directory shared like its
ReadWriteMany volume. The simulator's webhooks reach them through a round-robin balancer; one
container gets SIGTERM while events flow. Afterwards every event is in the inbox once, every
delivery done once (an ``http`` sink's consumer counts them), and the files are all there.
"""

from __future__ import annotations

import os
import re
import signal
import time
import tomllib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from tests.image.container import Container, check
from tests.image.host import Balancer, Consumer, Simulator, get, metric
from tests.image.sqlite_run import (
    SECRET,
    SINK_SECRET,
    container_env,
    owner_problems,
    with_test_wiring,
)
from tests.support.helpers import ROOT, free_port, wait_for, write_config
from tests.support.postgres import POSTGRES_URL, new_schema_name
from tests.support.services import service_reachable

EVENTS = 60
STOP_AFTER = 12  # events the first container has accepted when it gets SIGTERM
SERVE = ["receiver", "serve", "--config", "/etc/receiver/config.toml"]  # deployment.yaml's args


def configmap_config() -> dict[str, Any]:
    """The config.toml the Kubernetes ConfigMap carries."""
    text = (ROOT / "deploy" / "kubernetes-postgres" / "configmap.yaml").read_text()
    block = text.split("config.toml: |\n", 1)[1]
    lines = [line[4:] if line.startswith("    ") else line.strip() for line in block.splitlines()]
    return tomllib.loads("\n".join(lines))


async def run(image: str, meta: dict[str, Any], work: Path, say: Callable[[str], None]) -> None:
    where = urlsplit(POSTGRES_URL)
    if not service_reachable(where.hostname or "127.0.0.1", where.port or 5432):
        reason = f"PostgreSQL is not reachable at {where.hostname}:{where.port or 5432}"
        check(os.environ.get("RECEIVER_REQUIRE_SERVICES") != "1", reason)
        say(f"skipped: {reason}")
        return
    uid = int(meta["Config"]["User"].split(":")[0])
    schema = new_schema_name()
    downloads = work / "downloads"
    downloads.mkdir()
    os.chown(downloads, uid, uid)  # the volume's fsGroup/owner in deployment.yaml
    env = {**container_env(), "RECEIVER_STORE_URL": POSTGRES_URL}
    consumer = Consumer(SINK_SECRET)
    await consumer.start()
    containers: list[Container] = []
    configs: list[dict[str, Any]] = []
    balancer: Balancer | None = None
    simulator: Simulator | None = None
    try:
        ports = [free_port() for _ in range(2)]
        balancer = Balancer([f"http://127.0.0.1:{port}/webhooks" for port in ports])
        simulator = Simulator(work, target=balancer.url, secret=SECRET, events=EVENTS, rate=20)
        for n, port in enumerate(ports):
            config = with_test_wiring(configmap_config(), simulator.base_url, consumer.url)
            config["server"]["port"] = port
            config["store"]["schema"] = schema
            configs.append(config)
            path = write_config(work / f"config-{n}.toml", config)
            path.chmod(0o644)
            container = Container(
                image, f"receiver-image-test-pg{n}-{os.getpid()}", work / f"{n}.log"
            )
            await container.create()
            containers.append(container)
        volumes = [
            {
                work / f"config-{n}.toml": "/etc/receiver/config.toml:ro",
                downloads: "/data/downloads",
            }
            for n in range(2)
        ]

        # migrate-job.yaml: the store URL and the webhook secrets (the config must validate).
        job_env = {k: env[k] for k in ("RECEIVER_STORE_URL", "RECEIVER_WEBHOOK_SECRETS")}
        containers[0].env, containers[0].volumes = job_env, volumes[0]
        status, out = await containers[0].run(["receiver", "migrate", "--config", SERVE[-1]])
        check(status == 0, f"the migrate job's command failed: {out}")
        say("migrate --config /etc/receiver/config.toml (the Job's command): exit 0")

        for container, volume in zip(containers, volumes, strict=True):
            await container.start(SERVE, env, volume)
        ops = [f"http://127.0.0.1:{config['admin']['port']}" for config in configs]
        for n, url in enumerate(ops):

            async def ready(n: int = n, url: str = url) -> bool:
                proc = containers[n].proc
                check(
                    proc and proc.returncode is None,
                    f"container {n} exited:\n{containers[n].log()}",
                )
                return (await get(f"{url}/readyz"))[0] == 200

            await wait_for(ready, 60, 0.2, f"container {n}'s /readyz")
        say(f"two containers ready on schema {schema} (ports {ports[0]} and {ports[1]})")

        await balancer.start()
        await simulator.start()
        started = time.monotonic()

        async def first_has_taken_its_share() -> bool:
            text = (await get(f"{ops[0]}/metrics"))[1]
            return metric(text, "receiver_webhook_requests_total", outcome="accepted") >= STOP_AFTER

        await wait_for(first_has_taken_its_share, 60, 0.2, "events at the first container")
        text = (await get(f"{ops[0]}/metrics"))[1]
        accepted_first = metric(text, "receiver_webhook_requests_total", outcome="accepted")
        status = await containers[0].stop(
            signal.SIGTERM, configs[0]["server"]["shutdown_timeout_seconds"] + 10
        )
        check(status == 0, f"container 0 on SIGTERM: exit {status}\n{containers[0].log()[-2000:]}")
        say(
            f"container 0: SIGTERM after accepting {accepted_first:.0f} events, "
            f"{time.monotonic() - started:.1f} s into the run: exit 0"
        )

        summary = await simulator.settled(timeout=180)
        delivery = summary["delivery"]
        check(
            delivery["events_delivered"] == EVENTS == delivery["events"],
            f"not every event got a 2xx: {delivery}",
        )
        unreachable = sum(n for key, n in balancer.answers.items() if key.endswith("unreachable"))
        say(
            f"simulator: {EVENTS} events, {delivery['deliveries']} deliveries, "
            f"{delivery['attempts']} attempts, all answered 2xx ({unreachable} requests found the "
            "stopped container closed and went to the other)"
        )

        db = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
        try:

            async def settled() -> bool:
                pending = await db.fetchval("SELECT count(*) FROM events WHERE state = 'pending'")
                return pending == 0 and len(consumer.deliveries) >= EVENTS

            await wait_for(settled, 120, 0.2, "every event processed by the remaining container")
            states = Counter(r["state"] for r in await db.fetch("SELECT state FROM events"))
            deliveries = await db.fetch("SELECT event_id, sink, state FROM deliveries")
        finally:
            await db.close()
        check(states == {"done": EVENTS}, f"inbox states {dict(states)}")
        pairs = Counter((d["event_id"], d["sink"]) for d in deliveries)
        check(set(pairs.values()) == {1}, "more than one delivery row for an event and sink")
        check(
            not {d["state"] for d in deliveries} - {"done", "skipped"},
            f"deliveries {Counter(d['state'] for d in deliveries)}",
        )
        check(
            set(consumer.deliveries.values()) == {1} and len(consumer.deliveries) == EVENTS,
            f"http sink deliveries per event: {Counter(consumer.deliveries.values())}",
        )
        # Who answered: the balancer saw every 2xx (its count, unlike a stopped container's
        # metrics, includes what the first container took while draining).
        answered = [
            sum(
                n
                for key, n in balancer.answers.items()
                if key.startswith(backend) and key.rsplit(" ", 1)[1].startswith("2")
            )
            for backend in balancer.backends
        ]
        check(all(answered), f"the webhooks were not spread over both: {balancer.answers}")
        check(sum(answered) == delivery["deliveries"], f"2xx {answered} for {delivery}")
        say(
            f"inbox: {EVENTS} events done, once each; 2xx from the containers: "
            f"{answered[0]} + {answered[1]}; one delivery row per (event, sink); "
            "http sink: each event once"
        )
        files = [p for p in downloads.rglob("*") if p.is_file()]
        bad = owner_problems(downloads, uid)
        check(files and not bad, f"downloads: {len(files)} files; {bad[:5]}")
        say(f"shared volume: {len(files)} files, all owned by {uid}:{uid}, no temporary files")

        status = await containers[1].stop(
            signal.SIGTERM, configs[1]["server"]["shutdown_timeout_seconds"] + 10
        )
        check(status == 0, f"container 1 on SIGTERM: exit {status}")
        for n, container in enumerate(containers):
            check("Traceback" not in container.log(), f"a traceback in container {n}'s log")
            check(SECRET not in container.log(), f"the webhook secret in container {n}'s log")
        say("container 1: SIGTERM: exit 0; no traceback or secret in either log")
    finally:
        if simulator is not None:
            await simulator.stop()
        for container in containers:
            await container.remove()
        if balancer is not None:
            await balancer.stop()
        await consumer.stop()
        await _drop(schema)


async def _drop(schema: str) -> None:
    check(re.fullmatch(r"[a-z0-9_]+", schema), schema)
    db = await asyncpg.connect(POSTGRES_URL)
    try:
        await db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await db.close()
