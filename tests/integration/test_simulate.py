"""``receiver simulate`` as a whole: the simulator driving a real receiver, and its command line."""

from __future__ import annotations

import asyncio
import functools
import json

import aiohttp
import aiohttp.web
import pytest
from structlog.testing import capture_logs

from receiver.app import Runtime
from receiver.cli.common import CommandError
from receiver.config.load import parse_settings
from receiver.config.render import render_config
from receiver.simulator import handoff
from receiver.simulator import run as simulator_run
from receiver.simulator.cli import options_from_args
from receiver.simulator.delivery import DeliveryFaults
from receiver.simulator.run import SUMMARY_PATH, SimulateOptions, Simulation
from receiver.simulator.summary import render_summary
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.expect import expected_files
from tests.support.helpers import free_port, wait_for

SECRET = "whsec_simulate"
API_KEY = "service_" + "5a" * 32


async def test_simulated_upstream_with_faults_feeds_a_receiver_end_to_end(
    tmp_path, aiohttp_server, monkeypatch
) -> None:
    # --until-done ends once the API has been idle for 5 s (the receiver wants nothing more of
    # the two failed jobs); 1 s here, where every retry of the receiver comes within 0.1 s.
    monkeypatch.setattr(
        simulator_run, "wait_for_fetches", functools.partial(handoff.wait_for_fetches, idle=1.0)
    )
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
            # Until every delivery settled and the receiver fetched what they need.
            await asyncio.wait_for(simulation.run(asyncio.Event()), 60)

            summary = simulation.summary()
            # The two job.failed events: no sink of this receiver wants them, so it never
            # fetches their jobs; the simulator stopped once the receiver had been idle.
            assert summary["receiver_fetches_missing"] == 2
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
    sim = simulation.sim
    expected = expected_files(sim, [sim.payload_for(job_id) for job_id in sim.jobs])
    files = {p.relative_to(tmp_path / "dl").as_posix() for p in (tmp_path / "dl").rglob("*")}
    assert {f for f in files if (tmp_path / "dl" / f).is_file()} == expected
    assert expected
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
    # An intake-only receiver never fetches: the simulator waits --grace for it, then says so.
    args += ["--grace", "0.5"]
    code, out, err = await run_cli(*args, "--summary-json", str(summary_file))
    assert code == 0, out + err
    assert "Traceback" not in err
    assert "receiver fetched  the job and assets of 0 of 6 delivered events" in out
    assert "seed  " in out
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


# --- --until-done waits for the receiver's fetches; the seed; --config ---------------------------


def fetching_receiver(simulation: Simulation, *, delay: float, fetch: bool = True):
    """A receiver that answers 2xx at once and fetches the job and its assets ``delay`` later,
    recording when its last fetch ended."""
    fetched_at: list[float] = []
    tasks: set[asyncio.Task[None]] = set()

    async def fetch_later(payload: dict) -> None:
        await asyncio.sleep(delay)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{simulation.base_url}/jobs/{payload['job_id']}") as resp:
                assert resp.status == 200
            for asset_id in (payload.get("asset_ids") or {}).values():
                async with session.get(f"{simulation.base_url}/assets/{asset_id}") as resp:
                    assert resp.status == 200
        fetched_at.append(asyncio.get_running_loop().time())

    async def webhook(request: aiohttp.web.Request) -> aiohttp.web.Response:
        payload = await request.json()
        if fetch:
            task = asyncio.create_task(fetch_later(payload))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        return aiohttp.web.json_response({"status": "accepted"})

    app = aiohttp.web.Application()
    app.router.add_post("/webhooks", webhook)
    return app, fetched_at, tasks


async def test_until_done_keeps_the_api_up_until_the_receiver_has_fetched(aiohttp_server) -> None:
    options = SimulateOptions(port=0, events=3, rate=100, kinds=("logo", "failed"), until_done=True)
    async with Simulation(options) as simulation:
        app, fetched_at, _tasks = fetching_receiver(simulation, delay=1.0)
        server = await aiohttp_server(app)
        simulation.sim.add_webhook(str(server.make_url("/webhooks")), secret=SECRET)
        await asyncio.wait_for(simulation.run(asyncio.Event()), 30)
        stopped_at = asyncio.get_running_loop().time()
        summary = simulation.summary()
    assert len(fetched_at) == 3 and max(fetched_at) <= stopped_at
    assert summary["receiver_fetches_missing"] == 0
    assert "receiver fetched  the job and assets of 3 of 3 delivered events" in render_summary(
        summary
    )


async def test_until_done_stops_after_the_grace_period_and_says_what_is_missing(
    aiohttp_server,
) -> None:
    options = SimulateOptions(port=0, events=2, rate=100, until_done=True, grace=0.3)
    async with Simulation(options) as simulation:
        app, _fetched, _tasks = fetching_receiver(simulation, delay=0, fetch=False)
        server = await aiohttp_server(app)
        simulation.sim.add_webhook(str(server.make_url("/webhooks")), secret=SECRET)
        with capture_logs() as logs:
            await asyncio.wait_for(simulation.run(asyncio.Event()), 30)
    warning = next(e for e in logs if e["log_level"] == "warning")
    assert warning["events"] == 2 and "--grace" in warning["event"]
    assert simulation.summary()["receiver_fetches_missing"] == 2


def simulate_args(*args: str):
    from receiver.cli import build_parser

    return build_parser().parse_args(["simulate", *args])


def test_the_seed_is_random_unless_given_and_decides_the_event_ids() -> None:
    seeds = {options_from_args(simulate_args()).seed for _ in range(3)}
    assert len(seeds) == 3
    assert options_from_args(simulate_args("--seed", "42")).seed == 42

    def first_event_id(seed: int) -> str:
        return Simulation(SimulateOptions(seed=seed)).new_event("logo")["id"]

    assert first_event_id(42) == first_event_id(42) != first_event_id(43)
    summary = render_summary({**Simulation(SimulateOptions(seed=42)).summary(), "seed": 42})
    assert (
        "seed              42, shape mixed (--seed 42 --shape mixed repeats this run, event ids "
        "too)"
    ) in summary


def test_the_shape_is_a_flag_and_decides_what_objects_carry() -> None:
    assert options_from_args(simulate_args()).shape == "mixed"
    assert options_from_args(simulate_args("--shape", "minimal")).shape == "minimal"
    with pytest.raises(SystemExit):
        simulate_args("--shape", "everything")

    def shown(shape: str) -> list[dict]:
        sim = Simulation(SimulateOptions(seed=7, shape=shape)).sim
        payloads = [sim.add_job("animation") for _ in range(12)]
        return [sim.job_json(p["job_id"]) for p in payloads] + payloads

    full, minimal, mixed = shown("full"), shown("minimal"), shown("mixed")
    assert all("item_name" in job and "urls" in job for job in full[:12])
    assert all(set(body) == {"id", "object", "event", "job_id"} for body in minimal[12:])
    assert all("item_name" not in job and job["collection_id"] is None for job in minimal[:12])
    # mixed: some of each, and the same again for the same seed
    assert any("item_name" in job for job in mixed[:12])
    assert any("item_name" not in job for job in mixed[:12])
    assert any(set(body) == {"id", "object", "event", "job_id"} for body in mixed[12:])
    assert any("asset_ids" in body for body in mixed[12:])
    assert [sorted(o) for o in shown("mixed")] == [sorted(o) for o in mixed]


def test_config_supplies_the_target_secret_key_and_address(tmp_path) -> None:
    from receiver.cli.simulate import _from_config

    config = tmp_path / "config.toml"
    text = render_config(secret="whsec_from_config").replace("port = 8080", "port = 18081")
    text = text.replace('api_key = ""', 'api_key = "service_key"')
    config.write_text(text.replace("127.0.0.1:8090", "127.0.0.1:18091"))
    args = simulate_args("--config", str(config), "--events", "1")
    options = options_from_args(args, _from_config(args))
    assert (options.host, options.port, options.api_key) == ("127.0.0.1", 18091, "service_key")
    assert (options.target, options.secret) == (
        "http://127.0.0.1:18081/webhooks",
        "whsec_from_config",
    )
    args = simulate_args("--config", str(config), "--port", "0", "--secret", "s")
    assert options_from_args(args, _from_config(args)).port == 0  # a flag given wins
    assert options_from_args(args, _from_config(args)).secret == "s"

    config.write_text(text.replace("http://127.0.0.1:8090/v1", "https://api.example.com/v1"))
    with pytest.raises(CommandError, match="is not on this host"):
        _from_config(simulate_args("--config", str(config)))
