"""``receiver simulate``: the upstream stand-in as one process, with events and faults.

:class:`Simulation` serves a :class:`~receiver.simulator.Simulator` over HTTP, generates jobs of
the requested kinds at a steady rate, and delivers their webhooks with a
:class:`~receiver.simulator.sender.WebhookSender` to every active subscription: those created
through ``POST /v1/webhooks`` (each signed with its own secret) and the ad-hoc one that
``--target URL --secret S`` adds. Generation starts once a subscription exists, so
``receiver simulate --events 20`` followed by ``receiver webhooks register --url ...`` works.

``GET /_simulator/summary`` (no key needed) answers the live summary as JSON; the same summary is
printed when the simulation ends. The tests drive this class directly: one piece of code for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from receiver.logs import get_logger
from receiver.simulator.api import Simulator
from receiver.simulator.delivery import ATTEMPT_TIMEOUT_SECONDS, DeliveryFaults
from receiver.simulator.handoff import DEFAULT_GRACE_SECONDS, unfetched, wait_for_fetches
from receiver.simulator.model import KINDS
from receiver.simulator.sender import WebhookSender
from receiver.simulator.shape import DEFAULT_SHAPE, ShapeName
from receiver.simulator.summary import render_summary
from receiver.simulator.versions import VersionFaults

log = get_logger("receiver.simulator")

#: Event kinds ``--kinds`` accepts: the job kinds and ``failed`` (a ``job.failed`` event).
EVENT_KINDS = (*KINDS, "failed")
SUMMARY_PATH = "/_simulator/summary"
_FAILURE_REASONS = (
    "generation failed: the provider returned no image",
    "content policy: the prompt was refused",
    "generation timed out after 600 s",
)
_FAILED_KINDS = ("image", "animation", "logo", "scene")
_MASCOTS = 3


@dataclass(frozen=True)
class SimulateOptions:
    """Everything ``receiver simulate`` can be told (see ``receiver simulate --help``)."""

    host: str = "127.0.0.1"
    port: int = 8090
    api_key: str = ""
    examples: str | None = None
    target: str | None = None
    secret: str | None = None
    events: int = 0
    kinds: tuple[str, ...] = EVENT_KINDS
    rate: float = 5.0
    time_scale: float = 1.0
    attempt_timeout: float = ATTEMPT_TIMEOUT_SECONDS
    concurrency: int = 32
    faults: DeliveryFaults = field(default_factory=DeliveryFaults)
    derived_delay: float = 0.0
    derived_missing: bool = False
    pending_for: float = 0.0
    rate_limit_fraction: float = 0.0
    retry_after: float | None = None
    error_fraction: float = 0.0
    error_status: int = 500
    expired_url_fraction: float = 0.0
    latency: float = 0.0
    no_webhook_fraction: float = 0.0
    versions: VersionFaults = field(default_factory=VersionFaults)
    until_done: bool = False
    grace: float = DEFAULT_GRACE_SECONDS
    duration: float | None = None
    seed: int = 0
    shape: ShapeName = DEFAULT_SHAPE
    summary_json: str | None = None

    def problems(self) -> list[str]:
        """What is wrong with these options, one sentence each naming the flag."""
        problems: list[str] = []
        if (self.target is None) != (self.secret is None):
            problems.append("--target and --secret go together (the secret signs the webhooks)")
        if self.target is not None and not self.target.startswith(("http://", "https://")):
            problems.append(f"--target must be an http(s) URL, not {self.target!r}")
        unknown = [k for k in self.kinds if k not in EVENT_KINDS]
        if unknown or not self.kinds:
            problems.append(
                f"--kinds takes a comma-separated list of {', '.join(EVENT_KINDS)}"
                + (f" (not {', '.join(unknown)})" if unknown else "")
            )
        if self.events < 0:
            problems.append("--events must be 0 or more")
        if self.until_done and self.events == 0:
            problems.append("--until-done needs --events N (there is nothing to wait for)")
        for flag, value in (
            ("--rate", self.rate),
            ("--time-scale", self.time_scale),
            ("--attempt-timeout", self.attempt_timeout),
        ):
            if not value > 0:
                problems.append(f"{flag} must be positive")
        if self.grace < 0:
            problems.append("--grace must be 0 or more seconds")
        if self.duration is not None and not self.duration > 0:
            problems.append("--duration must be positive")
        for flag, value in (
            ("--duplicates", self.faults.duplicate_fraction),
            ("--out-of-order", self.faults.out_of_order_fraction),
            ("--rate-limit", self.rate_limit_fraction),
            ("--server-errors", self.error_fraction),
            ("--expired-urls", self.expired_url_fraction),
            ("--no-webhook", self.no_webhook_fraction),
        ):
            if not 0 <= value <= 1:
                problems.append(f"{flag} is a fraction between 0 and 1")
        for flag, value in (
            ("--derived-delay", self.derived_delay),
            ("--pending-for", self.pending_for),
            ("--latency", self.latency),
        ):
            if value < 0:
                problems.append(f"{flag} must be 0 or more seconds")
        if not 500 <= self.error_status <= 599:
            problems.append("--error-status must be a 5xx status")
        problems.extend(self.versions.problems())
        return problems


class Simulation:
    """A running simulator: the HTTP server, the event generator and the webhook sender."""

    def __init__(self, options: SimulateOptions) -> None:
        problems = options.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.options = options
        self.sim = Simulator(api_key=options.api_key, seed=options.seed, shape=options.shape)
        self.sim.derived_delay_seconds = options.derived_delay
        self.sim.derived_missing = options.derived_missing
        self.sim.job_pending_for_seconds = options.pending_for
        self.sim.rate_limit_fraction = options.rate_limit_fraction
        self.sim.retry_after = options.retry_after
        self.sim.error_fraction = options.error_fraction
        self.sim.error_status = options.error_status
        self.sim.expired_url_fraction = options.expired_url_fraction
        self.sim.latency_seconds = options.latency
        self.sim.no_webhook_fraction = options.no_webhook_fraction
        options.versions.apply(self.sim)
        self.sender = WebhookSender(
            self.sim,
            time_scale=options.time_scale,
            attempt_timeout=options.attempt_timeout,
            concurrency=options.concurrency,
            faults=options.faults,
            seed=options.seed + 1,  # its own stream: not the same draws as the API's faults
        )
        self.generated: Counter[str] = Counter()
        self.adopted = 0
        self.unannounced = 0  # jobs created that send no webhook
        self.base_url = ""
        self.generation_done = asyncio.Event()
        self._random = random.Random(options.seed + 2)
        # A few mascots with many items each, as an account has (collection = one mascot).
        self._mascots = [self.sim.new_id() for _ in range(_MASCOTS)]
        self._runner: web.AppRunner | None = None
        self._generator: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Serve the API, add the ad-hoc subscription, start generating events."""
        options = self.options
        if options.examples and Path(options.examples).is_dir():  # noqa: ASYNC240 - once
            self.adopted = len(self.sim.load_examples(options.examples))
        if options.target and options.secret:
            self.sim.add_webhook(options.target, secret=options.secret)
        app = self.sim.create_app()
        app.router.add_get(SUMMARY_PATH, self._summary_handler)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, options.host, options.port)
        await site.start()
        port = self._runner.addresses[0][1] if self._runner.addresses else options.port
        self.base_url = f"http://{options.host}:{port}/v1"
        self.sim.base_url = self.base_url
        await self.sender.start()
        self._generator = asyncio.create_task(self._generate(), name="simulator-events")

    @property
    def done(self) -> bool:
        """Every event generated and every delivery ended."""
        return self.generation_done.is_set() and self.sender.settled

    async def run(self, stop: asyncio.Event) -> None:
        """Wait for ``stop``, the ``--duration`` or (with ``--until-done``) everything done."""
        loop = asyncio.get_running_loop()
        deadline = None if self.options.duration is None else loop.time() + self.options.duration
        announced = False
        while not stop.is_set():
            if deadline is not None and loop.time() >= deadline:
                log.info("duration reached; stopping", seconds=self.options.duration)
                return
            if self.done and self.options.events:
                if self.options.until_done:
                    await wait_for_fetches(
                        self.sim, self.sender, grace=self.options.grace, stop=stop
                    )
                    return
                if not announced:
                    log.info("every event settled; still serving the API until stopped")
                    announced = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)

    async def close(self) -> None:
        """Stop generating and sending (scheduled retries end as stopped), then the server."""
        if self._generator is not None:
            self._generator.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._generator
        await self.sender.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Simulation:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    # ----------------------------------------------------------------- events

    async def _generate(self) -> None:
        options = self.options
        if options.events == 0:
            return
        # Jobs that send no webhook need no subscription: only polling finds them.
        if options.no_webhook_fraction < 1 and not self._has_subscription():
            log.info(
                "waiting for a webhook subscription before sending events",
                hint="POST /v1/webhooks (receiver webhooks register) or --target/--secret",
            )
            # Subscriptions come and go through the API handlers; a short poll is enough here.
            while not self._has_subscription():  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        started = loop.time()
        interval = 1.0 / options.rate
        for index in range(options.events):
            await asyncio.sleep(max(0.0, started + index * interval - loop.time()))
            payload = self.new_event(options.kinds[index % len(options.kinds)])
            if self.sim.jobs[payload["job_id"]].sends_webhook:
                self.sender.publish(payload)
            else:
                self.unannounced += 1
                log.info(
                    "job created; it sends no webhook",
                    job_id=payload["job_id"],
                    event_name=payload["event"],
                    watch_it=f"receiver watch {payload['job_id']}",
                )
        self.generation_done.set()
        log.info("every event generated", events=options.events)

    def new_event(self, kind: str) -> dict[str, Any]:
        """A new job of ``kind`` (or a failed one for ``failed``); returns its webhook payload."""
        self.generated[kind] += 1
        mascot = self._random.choice(self._mascots)
        if kind == "failed":
            return self.sim.add_failed_job(
                self._random.choice(_FAILED_KINDS),
                error=self._random.choice(_FAILURE_REASONS),
                collection_id=mascot,
            )
        return self.sim.add_job(kind, collection_id=mascot)

    def _has_subscription(self) -> bool:
        return any(hook.active for hook in self.sim.webhooks.values())

    # ----------------------------------------------------------------- summary

    def summary(self) -> dict[str, Any]:
        """What happened so far, as JSON (``GET /_simulator/summary``, ``--summary-json``)."""
        api: dict[str, dict[str, int]] = {}
        for (route, status), count in sorted(self.sim.responses.items()):
            if route.startswith("GET /_simulator"):
                continue
            api.setdefault(route, {})[str(status)] = count
        return {
            "base_url": self.base_url,
            "events_requested": self.options.events,
            "events_generated": dict(self.generated),
            "jobs_without_webhook": self.unannounced,
            "generation_done": self.generation_done.is_set(),
            "settled": self.done,
            "delivery": self.sender.summary().as_json(),
            "receiver_fetches_missing": unfetched(self.sim, self.sender),
            "api": api,
            "seed": self.options.seed,
            "shape": self.options.shape,
        }

    def render_summary(self) -> str:
        """The summary as a few readable lines."""
        return render_summary(self.summary())

    async def _summary_handler(self, _request: web.Request) -> web.Response:
        return web.json_response(self.summary())


async def run_simulator(options: SimulateOptions, *, out: Any = print) -> dict[str, Any]:
    """Run until SIGINT/SIGTERM, ``--duration`` or ``--until-done``; print the summary."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    simulation = Simulation(options)
    try:
        async with simulation:
            log.info(
                "simulator serving",
                base_url=simulation.base_url,
                example_jobs=simulation.adopted,
                api_key="required" if options.api_key else "any",
                events=options.events,
                target=options.target,
                time_scale=options.time_scale,
                seed=options.seed,
            )
            await simulation.run(stop)
        summary = simulation.summary()  # after close: scheduled retries now count as stopped
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    out(render_summary(summary))
    if options.summary_json:
        path = Path(options.summary_json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=2) + "\n")  # noqa: ASYNC240
    return summary
