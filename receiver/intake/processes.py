"""``receiver serve --processes N``: more intake processes on the same public port.

One Python process verifies and stores webhooks on one core at most. With ``server.processes``
above 1, the first process (the one started by the user or the service manager) runs as usual
(its role's listeners, the workers, the ops listener on ``admin.port``) and starts ``N - 1``
more processes that run only intake: the public listener, each with its own group commit, and
an ops listener of their own on ``admin.port + i`` (metrics, health, readiness and the admin
API of that process). Every public socket is bound with ``SO_REUSEPORT``, so the kernel spreads
new connections over the processes. Only the first process runs workers: with Postgres the
others' commits wake them at once (NOTIFY); with SQLite the workers find those events on their
next poll.

SIGTERM (or SIGINT) to the first process is passed on to the others; all drain together, and
the first exits 0 once every one of them has. If one of them dies on its own, the first stops
everything and exits 1, so the service manager restarts the whole set.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable

from receiver.config.settings import MAX_PROCESSES, Settings
from receiver.errors import ReceiverError
from receiver.logs import get_logger

log = get_logger("receiver.processes")

__all__ = ["MAX_PROCESSES", "IntakeProcesses", "ProcessFailed", "admin_port"]


class ProcessFailed(ReceiverError):
    """An intake process exited on its own."""


def admin_port(settings: Settings, index: int) -> int:
    """The ops listener's port of process ``index`` (0 is the first process)."""
    port = settings.admin.port
    return port + index if port else 0


class IntakeProcesses:
    """The extra intake processes (index 1 to N-1) started by the first one.

    ``on_failure`` is called when one exits before :meth:`stop` asked it to.
    """

    def __init__(self, settings: Settings, on_failure: Callable[[], None]) -> None:
        self._settings = settings
        self._on_failure = on_failure
        self._procs: list[asyncio.subprocess.Process] = []
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False
        self.failed: list[tuple[int, int]] = []  # (index, exit code) of those that died

    async def start(self) -> None:
        count = self._settings.server.processes
        for index in range(1, count):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "receiver",
                "serve",
                "--config",
                self._settings.source,
                "--role",
                "intake",
                "--processes",
                str(count),
                "--process-index",
                str(index),
            )
            self._procs.append(proc)
            self._watchers.append(asyncio.create_task(self._watch(index, proc)))
        log.info("intake processes started", pids=[p.pid for p in self._procs])

    async def _watch(self, index: int, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        if not self._stopping or code != 0:
            self.failed.append((index, code))
        if not self._stopping:
            log.error("an intake process exited; stopping", exited=index, exit_code=code)
            self._on_failure()

    def terminate(self) -> None:
        """Ask every process still running to drain and exit (SIGTERM)."""
        self._stopping = True
        for proc in self._procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)

    async def wait(self, timeout: float) -> None:
        """Wait for every process to exit; kill those still there after ``timeout``."""
        if not self._watchers:
            return
        _done, pending = await asyncio.wait(self._watchers, timeout=timeout)
        if pending:
            for proc in self._procs:
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            await asyncio.wait(pending)
        if self.failed:
            raise ProcessFailed(
                "intake processes exited with an error: "
                + ", ".join(f"process {index} (exit code {code})" for index, code in self.failed)
            )
