"""The subscription watchdog inside the receiver, against the simulator as the upstream."""

from __future__ import annotations

import aiohttp
import pytest
from structlog.testing import capture_logs

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.observe.metrics import Metrics
from receiver.simulator import Simulator
from receiver.simulator.sender import WebhookSender
from receiver.upstream.client import UpstreamClient
from receiver.upstream.watchdog import Watchdog
from tests.support.helpers import free_port, wait_for
from tests.support.upstream import serve_upstream

API_KEY = "service_" + "cd" * 32


@pytest.fixture
async def upstream(aiohttp_server) -> Simulator:
    return await serve_upstream(aiohttp_server, api_key=API_KEY, seed=21)


def settings_for(sim: Simulator, **api):
    return parse_settings(
        {
            "webhook": {"secrets": ["whsec_x"]},
            "api": {"base_url": sim.base_url, "api_key": API_KEY, **api},
            "store": {"url": "memory://"},
        },
        env={},
    )


def gauge(metrics: Metrics, name: str, webhook_id: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"webhook_id": webhook_id})


async def test_gauges_and_error_after_the_simulator_disables_a_subscription(upstream) -> None:
    sim = upstream
    broken = sim.add_webhook(f"http://127.0.0.1:{free_port()}/webhooks", secret="whsec_b")
    healthy = sim.add_webhook("https://receiver.example/webhooks", ["job.failed"])
    sender = WebhookSender(sim, time_scale=0.000001, concurrency=4)
    await sender.start()
    try:
        for _ in range(15):
            sender.publish(sim.add_job("image"))
        await sender.wait_settled()
    finally:
        await sender.close()
    assert broken.active is False and broken.consecutive_failures >= 100

    with capture_logs() as logs:
        async with Runtime(settings_for(sim, watchdog_interval_seconds=0.05)) as runtime:
            metrics = runtime.metrics

            async def seen() -> bool:
                return gauge(metrics, "receiver_upstream_webhook_active", broken.id) == 0

            await wait_for(seen, what="the watchdog's gauges")
            assert gauge(
                metrics, "receiver_upstream_webhook_consecutive_failures", broken.id
            ) == float(broken.consecutive_failures)
            assert gauge(metrics, "receiver_upstream_webhook_active", healthy.id) == 1
            assert gauge(metrics, "receiver_upstream_webhook_consecutive_failures", healthy.id) == 0
            rendered = metrics.render().decode()
            assert f'receiver_upstream_webhook_active{{webhook_id="{broken.id}"}} 0.0' in rendered

    errors = [e for e in logs if e["log_level"] == "error" and e.get("webhook_id") == broken.id]
    assert errors, logs
    assert f"receiver webhooks delete {broken.id}" in errors[0]["event"]
    assert f"receiver webhooks register --url {broken.url}" in errors[0]["event"]
    assert "receiver reconcile --collection ID" in errors[0]["event"]
    assert not [e for e in logs if e["log_level"] == "error" and e.get("webhook_id") == healthy.id]


async def test_warns_when_failures_grow_and_forgets_deleted_subscriptions(upstream) -> None:
    sim = upstream
    hook = sim.add_webhook("https://receiver.example/webhooks")
    metrics = Metrics()
    async with aiohttp.ClientSession() as session:
        client = UpstreamClient(session=session, base_url=sim.base_url, api_key=API_KEY, timeout=5)
        watchdog = Watchdog(upstream=client, metrics=metrics, interval=60)

        def warnings(logs):
            return [e for e in logs if e["log_level"] == "warning"]

        with capture_logs() as logs:
            assert await watchdog.check() is not None
        assert warnings(logs) == []
        assert gauge(metrics, "receiver_upstream_webhook_active", hook.id) == 1

        hook.consecutive_failures = 7
        with capture_logs() as logs:
            await watchdog.check()
        (warning,) = warnings(logs)
        assert (warning["consecutive_failures"], warning["previously"]) == (7, 0)
        assert "100" in warning["event"]
        assert gauge(metrics, "receiver_upstream_webhook_consecutive_failures", hook.id) == 7

        with capture_logs() as logs:
            await watchdog.check()  # no growth, no warning
        assert warnings(logs) == []

        del sim.webhooks[hook.id]
        await watchdog.check()
        assert gauge(metrics, "receiver_upstream_webhook_active", hook.id) is None
        assert gauge(metrics, "receiver_upstream_webhook_consecutive_failures", hook.id) is None
        assert watchdog.subscriptions == [] and watchdog.last_error is None
        checked = watchdog.checked_at

        sim.error_fraction = 1.0
        with capture_logs() as logs:
            assert await watchdog.check() is None  # logged, not raised
        assert "could not be checked" in warnings(logs)[0]["event"]
        # The inbox page shows the last list it got, when, and why the latest look failed.
        assert watchdog.subscriptions == [] and watchdog.checked_at == checked
        assert watchdog.last_error


async def test_runs_only_with_an_api_key(upstream) -> None:
    sim = upstream
    async with Runtime(settings_for(sim, api_key="")) as runtime:
        assert runtime.watchdog is None
    async with Runtime(settings_for(sim, watchdog_interval_seconds=0)) as runtime:
        assert runtime.watchdog is None
    async with Runtime(settings_for(sim), role="intake") as runtime:
        assert runtime.watchdog is None
    async with Runtime(settings_for(sim, watchdog_interval_seconds=120)) as runtime:
        assert runtime.watchdog is not None and runtime.watchdog.interval == 120

        async def looked() -> bool:
            return sim.requests["GET /v1/webhooks"] >= 1

        await wait_for(looked, what="the first look at the subscriptions")


def test_a_negative_interval_is_a_config_error() -> None:
    from receiver.errors import ConfigError

    with pytest.raises(ConfigError, match=r"api\.watchdog_interval_seconds"):
        parse_settings(
            {"webhook": {"secrets": ["s"]}, "api": {"watchdog_interval_seconds": -1}}, env={}
        )


async def test_the_list_follows_every_page(upstream) -> None:
    sim = upstream
    ids = {sim.add_webhook(f"https://r{i}.example/webhooks").id for i in range(120)}
    async with aiohttp.ClientSession() as session:
        client = UpstreamClient(session=session, base_url=sim.base_url, api_key=API_KEY, timeout=5)
        hooks = await client.list_webhooks()
    assert {h["id"] for h in hooks} == ids
    # 50 + 50 + 20 at the default page size; more when the upstream answers smaller pages
    # (its meta.pagination.limit says so, and the offset follows it).
    assert sim.requests["GET /v1/webhooks"] >= 3
