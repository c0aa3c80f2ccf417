"""One container on its SQLite inbox: the image as ``docker run -v DATA:/data -e SECRET`` runs it.

The image's own config (deploy/docker/config.toml) mounted with three changes: free ports (so
the ops listener is not on the default 9091, which the HEALTHCHECK must follow), the simulator
as upstream, and an ``http`` sink to a consumer on the host that counts deliveries. Secrets come
from the environment; the data directory is a host directory owned by the image's user.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.image.container import Container, check, process_uid
from tests.image.host import Consumer, Simulator, get, metric
from tests.support.helpers import ROOT, free_port, wait_for, write_config

SECRET = "whsec_image_test_" + "5e" * 12
API_KEY = "service_" + "3c" * 32
ADMIN_TOKEN = "admin_" + "9d" * 16
SINK_SECRET = "sink_" + "1f" * 16
EVENTS = 20


def container_env() -> dict[str, str]:
    return {
        "RECEIVER_WEBHOOK_SECRETS": SECRET,
        "RECEIVER_API_KEY": API_KEY,
        "RECEIVER_ADMIN_TOKEN": ADMIN_TOKEN,
    }


def with_test_wiring(config: dict[str, Any], api_url: str, consumer_url: str) -> dict[str, Any]:
    """Free ports, the simulator as upstream, a counting http sink; the rest as shipped."""
    config["server"]["port"] = free_port()
    config["admin"]["port"] = free_port()
    config["api"]["base_url"] = api_url
    for sink in config["sinks"]:
        sink["allow_private_networks"] = True  # the simulator's files are on 127.0.0.1
    config["sinks"].append(
        {
            "name": "consumer",
            "type": "http",
            "url": consumer_url,
            "secret": SINK_SECRET,
        }
    )
    return config


def owner_problems(directory: Path, uid: int) -> list[str]:
    """Paths under ``directory`` not owned by ``uid``, or left behind half-written."""
    bad = []
    for path in [directory, *directory.rglob("*")]:
        stat = path.stat()
        if stat.st_uid != uid or stat.st_gid != uid:
            bad.append(f"{path} owned by {stat.st_uid}:{stat.st_gid}")
        if path.is_file() and (path.name.startswith(".") or path.name.endswith(".tmp")):
            bad.append(f"{path} is a temporary file")
    return bad


async def healthcheck(container: Container, test: list[str]) -> tuple[int, str]:
    """The image's own HEALTHCHECK command, run inside the container as the engine runs it."""
    argv = test[1:] if test[0] == "CMD" else ["/bin/sh", "-c", test[1]]
    status, out = await container.run(argv)
    return status, out.strip().splitlines()[0] if out.strip() else ""


async def refuses_a_root_owned_volume(image: str, work: Path, say: Callable[[str], None]) -> None:
    """A volume the image's user cannot write: a clear one-line error and a non-zero exit."""
    data = work / "root-owned"
    data.mkdir(mode=0o755)
    container = Container(image, f"receiver-image-test-rootvol-{os.getpid()}", work / "rootvol.log")
    await container.create()
    try:
        started = time.monotonic()
        await container.start(["receiver", "serve"], container_env(), {data: "/data"})
        status = await container.wait(30)
        lines = [line for line in container.log().splitlines() if line.startswith("receiver:")]
        check(status != 0, "the receiver started on a volume it cannot write")
        check("Traceback" not in container.log(), f"a traceback:\n{container.log()}")
        check(lines and "/data" in lines[0], f"no clear error line:\n{container.log()}")
        say(f"root-owned volume: exit {status} in {time.monotonic() - started:.1f} s: {lines[0]}")
    finally:
        await container.remove()


async def run(image: str, meta: dict[str, Any], work: Path, say: Callable[[str], None]) -> None:
    uid = int(meta["Config"]["User"].split(":")[0])
    await refuses_a_root_owned_volume(image, work, say)

    data = work / "data"
    data.mkdir()
    os.chown(data, uid, uid)  # as an operator prepares a bind-mounted volume
    consumer = Consumer(SINK_SECRET)
    await consumer.start()
    image_config = tomllib.loads((ROOT / "deploy" / "docker" / "config.toml").read_text())
    container = Container(image, f"receiver-image-test-sqlite-{os.getpid()}", work / "receiver.log")
    simulator: Simulator | None = None
    try:
        # The simulator's port is only known once it is built; the config names it.
        public_port = free_port()
        simulator = Simulator(
            work,
            target=f"http://127.0.0.1:{public_port}/webhooks",
            secret=SECRET,
            events=EVENTS,
            rate=20,
        )
        config = with_test_wiring(image_config, simulator.base_url, consumer.url)
        config["server"]["port"] = public_port
        ops = f"http://127.0.0.1:{config['admin']['port']}"
        config_file = write_config(work / "config.toml", config)
        config_file.chmod(0o644)
        await container.create()
        await container.start(
            ["receiver", "serve"],
            container_env(),
            {data: "/data", config_file: "/etc/receiver/config.toml"},
        )
        started = time.monotonic()

        async def ready() -> bool:
            check(
                container.proc and container.proc.returncode is None,
                f"the container exited:\n{container.log()}",
            )
            return (await get(f"{ops}/readyz"))[0] == 200

        await wait_for(ready, 60, 0.2, "/readyz")
        say(
            f"started: /readyz 200 after {time.monotonic() - started:.1f} s "
            f"(public :{public_port}, ops :{config['admin']['port']}, not the default 9091)"
        )
        status, line = await healthcheck(container, meta["Healthcheck"]["Test"])
        check(status == 0, f"the HEALTHCHECK failed on ops port {config['admin']['port']}: {line}")
        say(f"HEALTHCHECK {meta['Healthcheck']['Test'][1:]}: exit 0: {line}")

        uids = {pid: process_uid(pid) for pid in container.inside_pids()}
        check(all(u == uid for u in uids.values()), f"processes not run as {uid}: {uids}")
        say(f"processes inside: {len(uids)}, all uid {uid} (none root)")

        await simulator.start()
        summary = await simulator.settled(timeout=120)
        delivery = summary["delivery"]
        check(
            delivery["events_delivered"] == EVENTS == delivery["events"],
            f"the simulator's deliveries did not all get a 2xx: {delivery}",
        )
        say(
            f"simulator: {EVENTS} events, {delivery['deliveries']} signed deliveries "
            f"({delivery['duplicates']} duplicates), all answered 2xx"
        )

        async def processed() -> bool:
            return len(consumer.deliveries) >= EVENTS and (
                metric((await get(f"{ops}/metrics"))[1], "receiver_inbox_events", state="pending")
                == 0
            )

        await wait_for(processed, 90, 0.2, "every event processed")
        check(
            set(consumer.deliveries.values()) == {1} and consumer.bad_signatures == 0,
            f"http sink deliveries per event: {dict(consumer.deliveries)}",
        )
        status, text = await get(f"{ops}/metrics")
        accepted = metric(text, "receiver_webhook_requests_total", outcome="accepted")
        check(status == 200 and accepted == EVENTS, f"/metrics: {status}, accepted {accepted}")
        say(
            f"/metrics 200: accepted {accepted:.0f}, duplicate "
            f"{metric(text, 'receiver_webhook_requests_total', outcome='duplicate'):.0f}; "
            f"http sink: each of {len(consumer.deliveries)} events once, signed"
        )

        files = [p for p in (data / "downloads").rglob("*") if p.is_file()]
        check(files, f"no files in the volume: {sorted(p.name for p in data.iterdir())}")
        bad = owner_problems(data, uid)
        check(not bad, f"in the volume: {bad[:5]}")
        say(f"volume: receiver.db and {len(files)} downloaded files, all owned by {uid}:{uid}")

        stopped = time.monotonic()
        status = await container.stop(
            signal.SIGTERM, config["server"]["shutdown_timeout_seconds"] + 5
        )
        check(status == 0, f"SIGTERM: exit {status}\n{container.log()[-2000:]}")
        say(
            f"SIGTERM: exit 0 after {time.monotonic() - stopped:.1f} s "
            f"(shutdown timeout {config['server']['shutdown_timeout_seconds']} s)"
        )
        status, line = await healthcheck(container, meta["Healthcheck"]["Test"])
        check(status != 0, "the HEALTHCHECK passes with the receiver stopped")
        say(f"HEALTHCHECK once stopped: exit {status}: {line}")
        check("Traceback" not in container.log(), f"a traceback in the log:\n{container.log()}")
        for secret in (SECRET, API_KEY, ADMIN_TOKEN, SINK_SECRET):
            check(secret not in container.log(), "a secret in the container's log")
        say("log: no traceback, no secret")
    finally:
        if simulator is not None:
            await simulator.stop()
        await container.remove()
        await consumer.stop()
        await asyncio.sleep(0)
