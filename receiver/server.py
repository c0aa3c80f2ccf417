"""One receiver process serving: its listeners, SIGTERM/SIGINT/SIGHUP, and graceful shutdown.

:func:`serve` opens a :class:`~receiver.app.Runtime`, starts the public listener (webhooks) and
the ops listener (metrics, health, admin, the inbox page), and on SIGTERM drains both with the
workers within ``server.shutdown_timeout_seconds``. With ``server.processes`` above 1 it also
starts and stops the other intake processes (:mod:`receiver.intake.processes`).
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys

import structlog
from aiohttp import web

from receiver.app import Role, Runtime
from receiver.config.settings import Settings
from receiver.intake.listener import PublicRunner
from receiver.intake.processes import IntakeProcesses, admin_port
from receiver.logs import get_logger

log = get_logger("receiver.server")

# How long a thread waiting for the GIL lets the thread holding it run before asking it to
# switch (CPython's default is 5 ms). Each SQLite connection runs on a thread of its own
# (aiosqlite) that takes the GIL back after every SQLite call, while under load the event loop's
# thread holds it almost all the time: an intake group's transaction, a dozen such calls, spent
# most of its time waiting for those switches. At 0.25 ms, bench-ingest's SQLite intake handles
# 1.14x the webhooks a second (0.5 ms: 1.09x, 0.1 ms: no more than 0.25 ms). A thread that
# nobody waits for is never asked to switch, so a lone event loop is not slowed.
GIL_SWITCH_INTERVAL_SECONDS = 0.00025


def freeze_startup_objects() -> None:
    """Leave everything made while starting (modules, the apps, their routes and settings) out
    of every later garbage collection.

    CPython's full collection walks every object the collector tracks, on the event loop's
    thread, while no webhook is answered: under load on SQLite (``make bench-waits``) four in
    twenty seconds, 32 ms on average and 40 at most. Nearly all of those objects were made at
    start and live as long as the process; frozen, they are never walked again (the same
    collections: 1.2 ms at most), and what requests leave behind is collected as before.
    (What was made at start and is dropped later inside a reference cycle, such as a store
    connection replaced after a fault, is not freed.)
    """
    gc.freeze()


async def serve(settings: Settings, *, role: Role = "all", process_index: int = 0) -> None:
    """Run until SIGTERM or SIGINT, then stop accepting, drain, release claims and return.

    With ``server.processes`` above 1, process 0 starts the other intake processes and stops
    them with itself (see :mod:`receiver.intake.processes`); ``process_index`` is set in those.
    """
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_SECONDS)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    drain = settings.server.shutdown_timeout_seconds
    several = settings.server.processes > 1 and role != "worker"
    if several:  # every log line says which of the processes wrote it
        structlog.contextvars.bind_contextvars(process=process_index)
    ops_port = admin_port(settings, process_index)
    others: IntakeProcesses | None = None
    # The first process checks the inbox file (and mends its indexes); the intake processes it
    # starts afterwards open the file it has just checked.
    async with Runtime(settings, role=role, check_store=process_index == 0) as runtime:
        loop.add_signal_handler(signal.SIGHUP, lambda: _reload_secrets(runtime))
        runners: list[web.AppRunner] = []  # the public one(s), then the ops one
        try:
            if role in ("all", "intake"):
                public = PublicRunner(
                    runtime.public_app(),
                    header_timeout=settings.server.read_timeout_seconds,
                    access_log=None,
                    shutdown_timeout=STRAGGLER_SECONDS,
                    auto_decompress=False,
                )
                await public.setup()
                runners.append(public)
                await web.TCPSite(
                    public, settings.server.host, settings.server.port, reuse_port=several or None
                ).start()
            ops = web.AppRunner(runtime.ops_app(), access_log=None, shutdown_timeout=drain)
            await ops.setup()
            runners.append(ops)
            await web.TCPSite(ops, settings.admin.host, ops_port).start()
            if several and process_index == 0:
                others = IntakeProcesses(settings, on_failure=stop.set)
                await others.start()
            freeze_startup_objects()
            log.info(
                "receiver started",
                role=role,
                pid=os.getpid(),
                public=f"{settings.server.host}:{settings.server.port}{settings.server.path}"
                if role != "worker"
                else None,
                ops=f"{settings.admin.host}:{ops_port}",
                store=settings.store.url.split("://", 1)[0],
                sinks=[s.name for s in settings.sinks],
                # uvloop when the `uvloop` extra is installed (receiver.cli.common.run_async)
                loop=type(loop).__module__.split(".", 1)[0],
            )
            await stop.wait()
            log.info("shutting down", drain_seconds=drain)
        finally:
            # One drain period for everything: the public listener stops accepting and answers
            # what is in flight while the workers stop claiming and finish (then release) theirs.
            # The ops listener goes last so readiness is served while draining.
            deadline = loop.time() + drain
            if others is not None:
                others.terminate()  # they drain at the same time as this one
            await asyncio.gather(
                _drain_public(runners[:-1], runtime, deadline),
                runtime.drain_workers(drain),
            )
            await runtime.close()
            if runners:
                await runners[-1].cleanup()
            if others is not None:
                await others.wait(max(0.0, deadline - loop.time()) + STRAGGLER_SECONDS + 5.0)
    log.info("stopped")


# After the drain deadline, a request still in flight on the public listener gets this long
# before it is cut (the upstream retries it: it never got a 2xx).
STRAGGLER_SECONDS = 0.25


async def _drain_public(runners: list[web.AppRunner], runtime: Runtime, deadline: float) -> None:
    """Close the listening sockets, wait (until ``deadline``) for the requests being handled.

    aiohttp's own graceful shutdown stops reading from every connection at once, so a request
    whose body was still arriving could never finish; closing the listener first and waiting
    for the handlers lets those bodies arrive. Answers sent meanwhile say ``Connection: close``.
    """
    loop = asyncio.get_running_loop()
    for runner in runners:
        for site in list(runner.sites):
            await site.stop()
    intake = runtime.intake
    if intake is not None:
        intake.drain()
        await intake.drained(deadline - loop.time())
    for runner in runners:
        await runner.cleanup()


def _reload_secrets(runtime: Runtime) -> None:
    try:
        count = runtime.secrets.reload()
    except Exception as exc:
        log.error("webhook secrets not reloaded; keeping the previous ones", error=str(exc))
        return
    log.info("webhook secrets reloaded", count=count)
