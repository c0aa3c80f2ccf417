"""The simulator's webhook sender: schedules, signs and POSTs each delivery, with retries.

:class:`WebhookSender` follows the rules of :mod:`receiver.simulator.delivery` (the retry
schedule, the attempt timeout, disabling a failing subscription) and applies its
:class:`~receiver.simulator.delivery.DeliveryFaults`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from receiver import __version__
from receiver.logs import get_logger
from receiver.signature import webhook_headers
from receiver.simulator.api import Simulator
from receiver.simulator.delivery import (
    ATTEMPT_TIMEOUT_SECONDS,
    DISABLE_AFTER_FAILURES,
    OUTCOMES,
    Attempt,
    Delivery,
    DeliveryFaults,
    DeliverySummary,
    classify,
    retry_delays,
)
from receiver.simulator.model import SimWebhook

log = get_logger("receiver.simulator")


class WebhookSender:
    """Delivers the simulator's events to its subscriptions, with the upstream's retries.

    ``start()`` it inside a running loop, :meth:`publish` payloads, :meth:`wait_settled` for every
    delivery to end (delivered, given up after 7 attempts, or stopped), ``close()`` it. The
    subscriptions are read from ``sim.webhooks`` at every attempt, so creating, deleting or
    disabling one through the simulator's API takes effect at once.
    """

    def __init__(
        self,
        sim: Simulator,
        *,
        time_scale: float = 1.0,
        attempt_timeout: float = ATTEMPT_TIMEOUT_SECONDS,
        concurrency: int = 32,
        faults: DeliveryFaults | None = None,
        seed: int = 0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.sim = sim
        self.delays = retry_delays(time_scale)
        self.attempt_timeout = attempt_timeout
        self.faults = faults or DeliveryFaults()
        self.deliveries: list[Delivery] = []
        self._events: set[str] = set()
        self._random = random.Random(seed)
        self._wall_clock = wall_clock
        self._slots = asyncio.Semaphore(max(1, concurrency))
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the HTTP session (cookies off: every attempt stands alone)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())

    async def close(self) -> None:
        """Stop every delivery still scheduled (state ``stopped``) and close the session."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def settled(self) -> bool:
        """True when no delivery is scheduled or in flight."""
        return not self._tasks

    async def wait_settled(self) -> None:
        """Wait until every delivery published so far has ended."""
        await self._idle.wait()

    def publish(self, payload: Mapping[str, Any]) -> list[Delivery]:
        """Deliver ``payload`` to every active subscription that wants its event.

        The body bytes are fixed here and identical on every attempt and duplicate. Returns the
        deliveries created (none when no subscription wants the event).
        """
        if self._session is None:
            raise RuntimeError("WebhookSender.start() has not been called")
        body = json.dumps(payload, separators=(",", ":")).encode()
        event_id, event_name = str(payload["id"]), str(payload["event"])
        self._events.add(event_id)
        loop = asyncio.get_running_loop()
        now = loop.time()
        created: list[Delivery] = []
        for hook in list(self.sim.webhooks.values()):
            if not hook.active or event_name not in hook.events:
                continue
            held = self._roll(self.faults.out_of_order_fraction)
            first_due = now + (
                self._random.uniform(0.25, 1.0) * self.faults.hold_back_seconds if held else 0.0
            )
            delivery = self._schedule(event_id, event_name, hook, body, now, first_due, held=held)
            created.append(delivery)
            if self._roll(self.faults.duplicate_fraction):
                again = first_due + self._random.uniform(0.05, 0.5)
                created.append(
                    self._schedule(event_id, event_name, hook, body, now, again, duplicate=True)
                )
        return created

    def summary(self) -> DeliverySummary:
        """Counts over every delivery so far (call it again later for fresher numbers)."""
        outcomes: Counter[str] = Counter({outcome: 0 for outcome in OUTCOMES})
        states: Counter[str] = Counter({"delivered": 0, "exhausted": 0, "stopped": 0})
        states["scheduled"] = 0
        attempts = 0
        for delivery in self.deliveries:
            states[delivery.state] += 1
            for attempt in delivery.attempts:
                attempts += 1
                outcomes[attempt.outcome] += 1
        latencies = tuple(
            d.latency for d in self.deliveries if not d.duplicate and d.latency is not None
        )
        return DeliverySummary(
            events=len(self._events),
            events_delivered=len({d.event_id for d in self.deliveries if d.state == "delivered"}),
            deliveries=len(self.deliveries),
            duplicates=sum(d.duplicate for d in self.deliveries),
            held_back=sum(d.held_back for d in self.deliveries),
            states=dict(states),
            attempts=attempts,
            outcomes=dict(outcomes),
            latencies=latencies,
            subscriptions=tuple(hook.as_json() for hook in self.sim.webhooks.values()),
        )

    # ----------------------------------------------------------------- internals

    def _roll(self, fraction: float) -> bool:
        return fraction > 0 and self._random.random() < fraction

    def _schedule(
        self,
        event_id: str,
        event_name: str,
        hook: SimWebhook,
        body: bytes,
        published: float,
        first_due: float,
        *,
        held: bool = False,
        duplicate: bool = False,
    ) -> Delivery:
        delivery = Delivery(
            id=next(self._ids),
            event_id=event_id,
            event_name=event_name,
            webhook_id=hook.id,
            body=body,
            published=published,
            first_due=first_due,
            duplicate=duplicate,
            held_back=held,
        )
        self.deliveries.append(delivery)
        task = asyncio.create_task(self._run(delivery), name=f"delivery-{delivery.id}")
        self._tasks.add(task)
        self._idle.clear()
        task.add_done_callback(self._finished)
        return delivery

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self._idle.set()

    async def _run(self, delivery: Delivery) -> None:
        loop = asyncio.get_running_loop()
        due = delivery.first_due
        try:
            for number in range(1, len(self.delays) + 2):
                await asyncio.sleep(max(0.0, due - loop.time()))
                async with self._slots:
                    hook = self._subscription(delivery)
                    if hook is None:
                        return
                    attempt = await self._attempt(delivery, hook, number, due)
                if self._settle(delivery, attempt):
                    return
                if number > len(self.delays):
                    delivery.state = "exhausted"
                    log.warning(
                        "webhook delivery given up after every retry",
                        event_id=delivery.event_id,
                        webhook_id=delivery.webhook_id,
                        attempts=number,
                    )
                    return
                due = attempt.finished + self.delays[number - 1]
                log.info(
                    "webhook attempt failed; retrying",
                    event_id=delivery.event_id,
                    webhook_id=delivery.webhook_id,
                    attempt=number,
                    outcome=attempt.status or attempt.outcome,
                    retry_in_seconds=round(self.delays[number - 1], 3),
                )
        except asyncio.CancelledError:
            if delivery.state == "scheduled":
                delivery.state, delivery.stop_reason = "stopped", "simulator stopped"
            raise

    def _subscription(self, delivery: Delivery) -> SimWebhook | None:
        """The delivery's subscription if it may still be sent to; else mark it stopped."""
        hook = self.sim.webhooks.get(delivery.webhook_id)
        if hook is None:
            delivery.state, delivery.stop_reason = "stopped", "subscription deleted"
        elif not hook.active:
            delivery.state, delivery.stop_reason = "stopped", "subscription disabled"
        else:
            return hook
        return None

    async def _attempt(
        self, delivery: Delivery, hook: SimWebhook, number: int, due: float
    ) -> Attempt:
        assert self._session is not None
        loop = asyncio.get_running_loop()
        signed_at = int(self._wall_clock() + self.faults.clock_skew_seconds)
        attempt = Attempt(number=number, due=due, started=loop.time(), signed_at=signed_at)
        delivery.attempts.append(attempt)
        headers = webhook_headers(
            hook.secret,
            delivery.body,
            signed_at,
            event_id=delivery.event_id,
            event_name=delivery.event_name,
        )
        headers["User-Agent"] = f"receiver-simulator/{__version__}"
        try:
            async with self._session.post(
                hook.url,
                data=delivery.body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.attempt_timeout),
                allow_redirects=False,
            ) as response:
                await response.read()
                attempt.status = response.status
                attempt.outcome = classify(response.status)
        except TimeoutError:
            attempt.outcome = "timeout"
        except (aiohttp.ClientError, OSError, ValueError):
            attempt.outcome = "error"
        attempt.finished = loop.time()
        return attempt

    def _settle(self, delivery: Delivery, attempt: Attempt) -> bool:
        """Count the attempt on its subscription; True when the delivery has ended."""
        hook = self.sim.webhooks.get(delivery.webhook_id)
        if attempt.outcome == "2xx":
            delivery.state = "delivered"
            if hook is not None and hook.active:
                hook.consecutive_failures = 0
            return True
        if hook is None or not hook.active:
            # Deleted or disabled while this attempt was in flight: deliveries have stopped.
            self._subscription(delivery)  # records which of the two
            return True
        hook.consecutive_failures += 1
        if hook.consecutive_failures >= DISABLE_AFTER_FAILURES:
            hook.active = False
            delivery.state, delivery.stop_reason = "stopped", "subscription disabled"
            log.warning(
                "webhook subscription disabled after consecutive failures",
                webhook_id=hook.id,
                url=hook.url,
                consecutive_failures=hook.consecutive_failures,
            )
            return True
        return False
