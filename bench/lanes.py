"""Delivery lanes: fast sinks keep their pace beside a paced sink and a hanging one.

``receiver simulate`` sends ``--events`` (1,000) ``logo`` events at ``--rate`` to one
``receiver serve``, in two set-ups measured in the same run, alternating rounds:

- ``fast only``: a download sink and an http sink whose consumer (local) answers at once;
- ``with slow sinks``: the same two, plus a slack-format chat sink paced at ``--chat-rate``
  (1 message/s) to a local capture server, and an http sink whose endpoint never answers (each
  attempt ends at its ``--hang-timeout``, 10 s); ``--slow chat`` or ``--slow stuck`` keeps
  only one of them.

Printed: the fast sinks' completion time (simulator start to every download and http delivery
done) in each set-up and their ratio (target <= 1.25), how long after the simulator's last 2xx
they finished, the chat lane's largest number of messages in any 10 s window, upstream API calls
per event (the simulator's counters), the receiver's CPU time and peak RSS. Each round is bounded by
``--timeout``; every server is stopped whatever happens::

    python -m bench.lanes [--events 1000] [--rate 200] [--rounds 3] [--slow chat,stuck]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from bench.common import (
    SECRET,
    WEBHOOK_PATH,
    Server,
    Table,
    bench_env,
    event_loop_name,
    free_port,
    machine_note,
    median,
    python_module,
    receiver_command,
    receiver_config,
    scratch,
)
from bench.proc import cpu_seconds, peak_rss_mb
from tests.support.peers import Capture

TARGET_RATIO = 1.25
WINDOW_SECONDS = 10.0
API_KEY = "service_" + "be" * 32  # the key bench.common.receiver_config gives the receiver
SUMMARY_PATH = "/_simulator/summary"
FAST_SINKS = ("files", "consumer")
UPSTREAM_ROUTES = ("GET /v1/jobs/{id}", "GET /v1/assets/{id}")


@dataclass
class Peers:
    """The sinks' far ends, served from this process: a consumer, a chat server, a black hole."""

    consumer: Capture = field(default_factory=Capture)
    chat: Capture = field(default_factory=Capture)
    hang: Capture = field(default_factory=Capture)
    urls: dict[str, str] = field(default_factory=dict)
    _runners: list[web.AppRunner] = field(default_factory=list)

    async def start(self) -> Peers:
        self.hang.hold = asyncio.Event()  # never set while the round runs: no answer, ever
        for name, capture in (
            ("consumer", self.consumer),
            ("chat", self.chat),
            ("hang", self.hang),
        ):
            # handler_cancellation: a request the receiver gave up on stops waiting here too.
            runner = web.AppRunner(capture.app(), access_log=None, handler_cancellation=True)
            await runner.setup()
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self._runners.append(runner)
            self.urls[name] = f"http://127.0.0.1:{port}/{name}"
        return self

    async def stop(self) -> None:
        assert self.hang.hold is not None
        self.hang.hold.set()
        for runner in self._runners:
            await runner.cleanup()


def sinks(peers: Peers, *, slow: bool, args: argparse.Namespace) -> list[Any]:
    chosen: list[dict[str, Any]] = [
        {"name": "files", "type": "download", "directory": "downloads"},
        {"name": "consumer", "type": "http", "url": peers.urls["consumer"], "secret": "c" * 24},
    ]
    chosen[0]["allow_private_networks"] = True
    slow_sinks = {
        "chat": {
            "name": "chat",
            "type": "slack",
            "format": "slack",
            "url": peers.urls["chat"],
            "rate_limit_per_second": args.chat_rate,
        },
        "stuck": {
            "name": "stuck",
            "type": "http",
            "url": peers.urls["hang"],
            "secret": "s" * 24,
            "timeout_seconds": args.hang_timeout,
        },
    }
    if slow:
        chosen += [slow_sinks[name] for name in args.slow]
    return chosen


@dataclass
class Round:
    """What one run of one set-up measured."""

    slow: bool
    fast_done: float | None = None  # seconds from the simulator's start
    last_2xx: float | None = None
    upstream_calls: int = 0
    peak_rss: float = 0.0
    cpu_seconds: float = 0.0
    chat_max_in_window: int = 0
    chat_messages: int = 0
    hang_attempts: int = 0
    lanes: dict[str, dict[str, float]] = field(default_factory=dict)


def successes(metrics_text: str) -> dict[str, float]:
    """Successful deliveries by sink, from a /metrics page."""
    done: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            success = sample.labels.get("outcome") == "success"
            if sample.name == "receiver_sink_deliveries_total" and success:
                done[sample.labels["sink"]] = sample.value
    return done


def lane_gauges(metrics_text: str) -> dict[str, dict[str, float]]:
    """``receiver_sink_{backlog,oldest_due_seconds,in_flight}`` by sink, when exported."""
    lanes: dict[str, dict[str, float]] = {}
    wanted = (
        "receiver_sink_backlog",
        "receiver_sink_oldest_due_seconds",
        "receiver_sink_in_flight",
    )
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in wanted:
                short = sample.name.removeprefix("receiver_sink_")
                lanes.setdefault(sample.labels["sink"], {})[short] = sample.value
    return lanes


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as response:
        return await response.json()


async def get_text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as response:
        return await response.text()


async def run_round(args: argparse.Namespace, work: Path, *, slow: bool) -> Round:
    result = Round(slow=slow)
    peers = await Peers().start()
    port, admin_port, sim_port = free_port(), free_port(), free_port()
    config = receiver_config(
        work,
        port=port,
        admin_port=admin_port,
        base_url=f"http://127.0.0.1:{sim_port}/v1",
        sinks=sinks(peers, slow=slow, args=args),
    )
    receiver = Server(
        "receiver",
        receiver_command(config, "all", args.loop),
        port=admin_port,
        cwd=work,
        env=bench_env(),
    )
    simulator = Server(
        "simulator",
        python_module(
            args.loop,
            "receiver",
            "simulate",
            *("--port", str(sim_port), "--api-key", API_KEY, "--kinds", "logo"),
            *("--target", f"http://127.0.0.1:{port}{WEBHOOK_PATH}", "--secret", SECRET),
            *("--events", str(args.events), "--rate", str(args.rate), "--seed", "7"),
            *("--log-level", "warning"),
        ),
        port=sim_port,
        cwd=work,
        env=bench_env(),
    )
    ops = f"http://127.0.0.1:{admin_port}"
    try:
        await asyncio.to_thread(receiver.start)
        started = time.monotonic()
        await asyncio.to_thread(simulator.start, SUMMARY_PATH)
        deadline = started + args.timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                now = time.monotonic() - started
                summary = await get_json(session, f"http://127.0.0.1:{sim_port}{SUMMARY_PATH}")
                if (
                    result.last_2xx is None
                    and summary["delivery"]["events_delivered"] >= args.events
                ):
                    result.last_2xx = now
                done = successes(await get_text(session, f"{ops}/metrics"))
                if result.fast_done is None and all(
                    done.get(s, 0) >= args.events for s in FAST_SINKS
                ):
                    result.fast_done = now
                if result.fast_done is not None and (not slow or now >= args.observe):
                    break
                await asyncio.sleep(0.1)
            metrics_text = await get_text(session, f"{ops}/metrics")
            result.lanes = lane_gauges(metrics_text)
            summary = await get_json(session, f"http://127.0.0.1:{sim_port}{SUMMARY_PATH}")
        api = summary["api"]
        result.upstream_calls = sum(sum(api.get(route, {}).values()) for route in UPSTREAM_ROUTES)
        result.peak_rss = peak_rss_mb(receiver.pid())
        result.cpu_seconds = cpu_seconds(receiver.pid())
        result.chat_messages = len(peers.chat.times)
        result.chat_max_in_window = peers.chat.most_in_window(WINDOW_SECONDS)
        result.hang_attempts = len(peers.hang.times)
    finally:
        await asyncio.to_thread(simulator.stop)
        await asyncio.to_thread(receiver.stop)
        await peers.stop()
    return result


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


async def bench(args: argparse.Namespace) -> int:
    rounds: list[Round] = []
    for n in range(args.rounds):
        # Alternate which set-up goes first: drift in the machine's load hits both alike.
        for slow in (False, True) if n % 2 == 0 else (True, False):
            with scratch("lanes-", keep=args.keep) as work:
                label = "with slow sinks" if slow else "fast only"
                print(f"  round {n + 1}: {label} ...", flush=True)
                rounds.append(await run_round(args, work, slow=slow))
    table = Table(
        [
            "set-up",
            "last 2xx",
            "fast sinks done",
            "after last 2xx",
            "upstream calls/event",
            "receiver CPU",
            "RSS",
        ]
    )
    for r in rounds:
        tail = None if r.fast_done is None or r.last_2xx is None else r.fast_done - r.last_2xx
        table.add(
            "with slow sinks" if r.slow else "fast only",
            seconds(r.last_2xx),
            seconds(r.fast_done),
            seconds(tail),
            f"{r.upstream_calls / args.events:.2f}",
            f"{r.cpu_seconds:.1f} s",
            f"{r.peak_rss:.0f} MiB peak",
        )
    print(table.render())
    for r in rounds:
        if r.slow:
            limit = args.chat_rate * WINDOW_SECONDS
            print(
                f"  chat lane: {r.chat_messages} messages in {args.observe:.0f}+ s, at most "
                f"{r.chat_max_in_window} in any {WINDOW_SECONDS:.0f} s window "
                f"({r.chat_max_in_window / WINDOW_SECONDS:.2f}/s; pace {args.chat_rate:g}/s = "
                f"{limit:.0f} per window plus the bucket's burst); hanging sink: "
                f"{r.hang_attempts} attempts"
            )
            for sink, gauges in sorted(r.lanes.items()):
                shown = ", ".join(f"{k} {v:g}" for k, v in sorted(gauges.items()))
                print(f"    lane {sink}: {shown}")
    fast = [r.fast_done for r in rounds if not r.slow]
    slow = [r.fast_done for r in rounds if r.slow]
    if None in fast or None in slow:
        print(f"MISS  the fast sinks did not finish within {args.timeout:.0f} s in some round")
        return 0
    ratio = median([s for s in slow if s]) / median([f for f in fast if f])
    verdict = "PASS" if ratio <= TARGET_RATIO else "MISS"
    print(
        f"{verdict}  fast sinks {ratio:.2f}x as long with the slow sinks as without "
        f"(target <= {TARGET_RATIO})"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=200.0, help="events/s the simulator sends")
    parser.add_argument("--chat-rate", type=float, default=1.0, help="the chat lane's pace")
    parser.add_argument("--hang-timeout", type=float, default=10.0, help="the hanging sink's")
    parser.add_argument(
        "--slow",
        type=lambda value: [v for v in value.split(",") if v],
        default=["chat", "stuck"],
        help="the slow sinks beside the fast ones: chat, stuck or both (default chat,stuck)",
    )
    parser.add_argument("--observe", type=float, default=30.0, help="seconds of chat to watch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=180.0, help="per round")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default=event_loop_name())
    parser.add_argument("--keep", action="store_true", help="keep the work directories")
    args = parser.parse_args(argv)
    print(f"bench lanes: {machine_note(args.loop)}")
    print(
        f"  {args.events:,} logo events at {args.rate:g}/s; slow sinks: chat at "
        f"{args.chat_rate:g}/s, an http endpoint that never answers "
        f"({args.hang_timeout:g} s timeout)"
    )
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
