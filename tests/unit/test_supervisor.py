"""Background tasks: an unexpected exception is logged with the task's name, the task restarts
with backoff, and /readyz says which one is down meanwhile."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.observe.metrics import Metrics
from receiver.store.memory import MemoryStore
from receiver.supervisor import Supervisor
from tests.support.helpers import wait_for


def flaky(failures: int, runs: list[int]):
    """A loop that raises the first ``failures`` times it runs, then runs until cancelled."""

    async def loop() -> None:
        runs.append(len(runs))
        if len(runs) <= failures:
            raise RuntimeError("boom")
        await asyncio.Event().wait()

    return loop


async def test_a_failing_task_is_logged_restarted_and_counted() -> None:
    metrics = Metrics()
    supervisor = Supervisor(metrics=metrics, backoff_initial=0.01, backoff_max=0.04)
    runs: list[int] = []
    with capture_logs() as logs:
        supervisor.start("gauges", flaky(4, runs))

        async def running_again() -> bool:
            return len(runs) == 5

        await wait_for(running_again, what="the fifth run")
        assert supervisor.down() == {}
        await supervisor.stop()
    errors = [e for e in logs if e["log_level"] == "error"]
    assert [e["task"] for e in errors] == ["gauges"] * 4
    assert all(isinstance(e["exc_info"], RuntimeError) for e in errors)
    # Doubling from backoff_initial, capped at backoff_max.
    assert [e["restart_in"] for e in errors] == [0.01, 0.02, 0.04, 0.04]
    value = metrics.registry.get_sample_value(
        "receiver_background_task_restarts_total", {"task": "gauges"}
    )
    assert value == 4


async def test_the_task_is_down_while_it_waits_for_its_restart() -> None:
    supervisor = Supervisor(backoff_initial=0.3)
    runs: list[int] = []
    with capture_logs():
        supervisor.start("prune", flaky(1, runs))
        await asyncio.sleep(0.05)
        assert supervisor.down() == {"prune": "failed (RuntimeError); restarting in 0.3 s"}

        async def up() -> bool:
            return not supervisor.down() and len(runs) == 2

        await wait_for(up, what="the restart")
        await supervisor.stop()


async def test_a_task_that_returns_is_restarted_too_and_a_long_run_resets_the_backoff() -> None:
    supervisor = Supervisor(backoff_initial=0.01, stable_after=0.0)
    runs: list[int] = []

    async def returns() -> None:
        runs.append(1)

    with capture_logs() as logs:
        supervisor.start("watchdog", returns)

        async def three() -> bool:
            return len(runs) >= 3

        await wait_for(three, what="three runs")
        await supervisor.stop()
    reasons = {(e["reason"], e["restart_in"]) for e in logs if e.get("task") == "watchdog"}
    assert reasons == {("ended", 0.01)}


async def test_stop_and_cancel_end_tasks_without_restarting_them() -> None:
    supervisor = Supervisor()
    runs: list[int] = []
    with capture_logs() as logs:
        supervisor.start("a", flaky(0, runs))
        supervisor.start("b", flaky(0, runs))
        await asyncio.sleep(0.01)
        await supervisor.cancel("a")
        assert supervisor.names == ["b"]
        await supervisor.stop()
    assert supervisor.names == [] and supervisor.down() == {}
    assert logs == []


class GaugesFail(MemoryStore):
    """A store whose counts() raises an unexpected error once."""

    failed = False

    async def counts(self):  # type: ignore[no-untyped-def]
        if not GaugesFail.failed:
            GaugesFail.failed = True
            raise ValueError("unexpected")
        return await super().counts()


async def test_readyz_names_a_background_task_that_is_down(aiohttp_client) -> None:
    settings = parse_settings({"webhook": {"secrets": ["whsec_x"]}}, env={})
    store = GaugesFail(settings.store)
    with capture_logs() as logs:
        async with Runtime(settings, store=store, sinks=[]) as runtime:
            ops = await aiohttp_client(runtime.ops_app())

            async def gauges_down() -> bool:
                return "gauges" in runtime.supervisor.down()

            await wait_for(gauges_down, what="the gauges task to fail")
            ready = await ops.get("/readyz")
            assert ready.status == 503
            body = await ready.json()
            assert body["reasons"] == [
                "background task gauges: failed (ValueError); restarting in 1 s"
            ]

            async def ready_again() -> bool:
                return (await ops.get("/readyz")).status == 200

            await wait_for(ready_again, timeout=10, what="the gauges task to restart")
            assert sorted(runtime.supervisor.names) == ["gauges", "leases", "prune", "redeliveries"]
    assert any(e.get("task") == "gauges" and e["log_level"] == "error" for e in logs)
