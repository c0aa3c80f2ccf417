"""Background tasks that must keep running: restarted with backoff, never dying silently.

A receiver process runs a few loops beside its listeners (inbox gauges, pruning, the subscription
watchdog, lease extension). Each is written to run until cancelled and to handle the failures it
expects (a store outage, an unreachable upstream) itself. An *unexpected* exception would end
its task without a word: the gauges freeze, pruning stops, and nobody knows.
:class:`Supervisor` runs each loop as a named task; when one raises (or returns), it logs the
exception with the task's name, counts it in ``receiver_background_task_restarts_total{task}``,
and starts it again after a backoff (doubling up to ``backoff_max``, back to the start once a
run has lasted ``stable_after`` seconds). While a task waits for its restart, :meth:`down` names
it, and ``/readyz`` answers 503 with that reason.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from receiver.logs import get_logger
from receiver.observe.metrics import Metrics

log = get_logger("receiver.supervisor")

Loop = Callable[[], Awaitable[None]]


class Supervisor:
    """Runs named background loops and restarts any that fails (see the module docstring)."""

    def __init__(
        self,
        *,
        metrics: Metrics | None = None,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        stable_after: float = 60.0,
    ) -> None:
        self._metrics = metrics
        self._initial = backoff_initial
        self._max = backoff_max
        self._stable_after = stable_after
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._down: dict[str, str] = {}

    def start(self, name: str, loop: Loop) -> None:
        """Run ``loop()`` as the task ``name`` until :meth:`stop`, restarting it when it fails."""
        if name in self._tasks:
            raise ValueError(f"a background task named {name!r} already runs")
        self._tasks[name] = asyncio.create_task(self._keep(name, loop), name=name)

    def down(self) -> dict[str, str]:
        """The tasks waiting to be restarted, each with why (for ``/readyz``)."""
        return dict(self._down)

    @property
    def names(self) -> list[str]:
        return list(self._tasks)

    async def cancel(self, name: str) -> None:
        """Cancel the task ``name`` (if it runs) and wait for it to end."""
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._down.pop(name, None)

    async def stop(self) -> None:
        """Cancel every task and wait for them to end."""
        for name in list(self._tasks):
            await self.cancel(name)

    async def _keep(self, name: str, loop: Loop) -> None:
        clock = asyncio.get_running_loop().time
        delay = self._initial
        while True:
            started = clock()
            try:
                await loop()
                problem, exc_info = "ended", None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                problem, exc_info = f"failed ({type(exc).__name__})", exc
            if clock() - started >= self._stable_after:
                delay = self._initial
            self._down[name] = f"{problem}; restarting in {delay:g} s"
            log.error(
                "background task stopped unexpectedly; restarting it",
                task=name,
                reason=problem,
                restart_in=delay,
                exc_info=exc_info,
            )
            if self._metrics is not None:
                self._metrics.background_task_restarts.labels(name).inc()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._max)
            self._down.pop(name, None)
