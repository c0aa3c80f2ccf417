"""``receiver simulate`` as a whole: the simulator driving a real receiver, and its command line."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from receiver.app import Runtime
from receiver.config import parse_settings
from receiver.simulator.delivery import DeliveryFaults
from receiver.simulator.run import SUMMARY_PATH, SimulateOptions, Simulation, render_summary
from tests.helpers import free_port, wait_for
from tests.integration.test_cli import assert_one_clean_line, run_cli

SECRET = "whsec_simulate"
API_KEY = "service_" + "5a" * 32


async def test_simulated_upstream_with_faults_feeds_a_receiver_end_to_end(
    tmp_path, aiohttp_server
) -> None:
    options = SimulateOptions(
        port=0,
        api_key=API_KEY,
        events=10,
        rate=100,
        time_scale=0.0001,
        faults=DeliveryFaults(
            duplicate_fraction=0.3,
            out_of_order_fraction=0.3,
            hold_back_seconds=0.3,
            clock_skew_seconds=20,
        ),
        derived_delay=0.3,
        rate_limit_fraction=0.1,
        error_fraction=0.1,
        expired_url_fraction=0.2,
        until_done=True,
        seed=7,
    )
    async with Simulation(options) as simulation:
        settings = parse_settings(
            {
                "webhook": {"secrets": [SECRET]},
                "api": {"base_url": simulation.base_url, "api_key": API_KEY, "timeout_seconds": 5},
                "store": {"url": f"sqlite:///{tmp_path}/inbox.db"},
                "worker": {
                    "backoff_initial_seconds": 0.02,
                    "backoff_max_seconds": 0.1,
                    "poll_interval_seconds": 0.02,
                    "max_attempts": 100,
                },
                "sinks": [
                    {
                        "name": "files",
                        "type": "download",
                        "directory": str(tmp_path / "dl"),
                        "events": ["job.completed"],
                        "allow_private_networks": True,
                    }
                ],
            },
            env={},
        )
        async with Runtime(settings) as runtime:
            server = await aiohttp_server(runtime.public_app())
            assert simulation.summary()["delivery"]["events"] == 0  # waits for a subscription
            simulation.sim.add_webhook(str(server.make_url("/webhooks")), secret=SECRET)
            await asyncio.wait_for(simulation.run(asyncio.Event()), 30)

            summary = simulation.summary()
            delivery = summary["delivery"]
            assert delivery["events"] == 10
            assert delivery["states"]["delivered"] == delivery["deliveries"] >= 10
            assert delivery["outcomes"]["2xx"] == delivery["deliveries"]
            assert summary["settled"] and summary["generation_done"]

            async def processed() -> bool:
                events = await runtime.store.list(limit=100)
                return len(events) == 10 and all(e.state == "done" for e in events)

            await wait_for(processed, 30, what="every event processed")

            async with (
                aiohttp.ClientSession() as session,
                session.get(simulation.base_url.removesuffix("/v1") + SUMMARY_PATH) as resp,
            ):
                live = await resp.json()
            assert live["delivery"]["events"] == 10

    # Every completed job's files were downloaded despite 429s, 5xx, expired URLs and derived
    # formats finishing late; the failed jobs have none.
    completed = [j for j in simulation.sim.jobs.values() if j.outcome == "completed"]
    expected = sum(len(job.asset_ids) for job in completed)
    files = [p for p in (tmp_path / "dl").rglob("*") if p.is_file()]
    assert len(files) == expected > 0
    assert simulation.generated == {"image": 2, "animation": 2, "logo": 2, "scene": 2, "failed": 2}
    served = summary["api"]
    refused = sum(n for route in served.values() for status, n in route.items() if status != "200")
    assert refused > 0  # the faults did happen (429, 500, expired URLs: 1 in 5 calls or so)
    text = render_summary(summary)
    sent = "events sent       10 (image 2, animation 2, logo 2, scene 2, failed 2); 10 got a 2xx"
    assert sent in text
    assert "latency to 2xx    10 events" in text


@pytest.fixture
async def intake(tmp_path, aiohttp_server):
    settings = parse_settings(
        {"webhook": {"secrets": [SECRET]}, "store": {"url": f"sqlite:///{tmp_path}/r.db"}}, env={}
    )
    async with Runtime(settings, role="intake") as runtime:
        server = await aiohttp_server(runtime.public_app())
        yield runtime, str(server.make_url("/webhooks"))


async def test_the_command_until_done(tmp_path, intake) -> None:
    runtime, url = intake
    summary_file = tmp_path / "out" / "summary.json"
    args = ["simulate", "--port", str(free_port()), "--target", url, "--secret", SECRET]
    args += ["--events", "6"]
    args += ["--rate", "100", "--duplicates", "0.5", "--until-done", "--log-level", "warning"]
    code, out, err = await run_cli(*args, "--summary-json", str(summary_file))
    assert code == 0, out + err
    assert "Traceback" not in err
    assert out.startswith("simulator summary\n")
    assert "events sent       6 (" in out
    summary = json.loads(summary_file.read_text())
    assert summary["delivery"]["states"]["delivered"] == summary["delivery"]["deliveries"]
    events = await runtime.store.list(limit=100)
    assert len(events) == 6


async def test_the_command_fails_when_the_receiver_refuses(intake) -> None:
    _, url = intake
    code, out, err = await run_cli(
        "simulate",
        "--port",
        str(free_port()),
        "--target",
        url,
        "--secret",
        "whsec_wrong",
        "--events",
        "2",
        "--kinds",
        "logo",
        "--time-scale",
        "0.000001",
        "--until-done",
        "--log-level",
        "error",
    )
    assert code == 1, out + err
    assert "attempts          14: 2xx 0, 4xx 14" in out
    assert "0 delivered, 2 given up after 7 attempts" in out


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--target", "http://127.0.0.1:1/w"], "--target and --secret go together"),
        (["--events", "2", "--kinds", "image,video"], "--kinds"),
        (["--duplicates", "1.5"], "--duplicates is a fraction"),
        (["--until-done"], "--until-done needs --events"),
        (["--time-scale", "0"], "--time-scale must be positive"),
    ],
)
async def test_bad_flags_are_one_line(args, needle) -> None:
    code, out, err = await run_cli("simulate", *args)
    assert code == 1 and needle in err and out == ""
    assert_one_clean_line(err)
    assert len(err.strip().splitlines()) == 1


async def test_a_busy_port_is_one_line() -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = await run_cli("simulate", "--port", str(port), "--log-level", "error")
    assert code == 1 and f"127.0.0.1:{port}" in err
    assert_one_clean_line(err)


async def test_help_documents_the_flags() -> None:
    code, out, _ = await run_cli("simulate", "--help")
    assert code == 0
    for flag in (
        "--target",
        "--secret",
        "--events",
        "--kinds",
        "--time-scale",
        "--duplicates",
        "--out-of-order",
        "--clock-skew",
        "--derived-delay",
        "--rate-limit",
        "--retry-after",
        "--server-errors",
        "--expired-urls",
        "--until-done",
        "--duration",
    ):
        assert flag in out, flag
    assert "1 min, 5 min, 30 min, 2 h, 6 h, 12 h" in out
