"""A whole receiver for the browser tests: ``receiver serve`` in a subprocess, the simulator as
its upstream (API and signed webhooks), and HTTP sinks that capture what they are sent.

The simulator and the capture servers run on an event loop in a background thread, so the
browser tests themselves stay plain synchronous code driving Playwright's sync API.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from receiver.simulator import Simulator
from receiver.simulator.sender import WebhookSender
from tests.support.helpers import ReceiverProcess, free_port, write_config
from tests.support.peers import Capture

T = TypeVar("T")

ADMIN_TOKEN = "inbox-admin-token-0123456789abcdef"
WEBHOOK_SECRET = "whsec_inbox_browser"
API_KEY = "service_" + "ab" * 32
SINK_SECRET = "consumer-secret"


class Stack:
    """Start with :meth:`start`, stop with :meth:`stop`; ``ops_url`` is the inbox's origin.

    Sinks: ``consumer`` (an HTTP consumer that answers 200, sent every event) and ``archive``
    (sent ``job.failed`` events only; it answers 503, so they die after two attempts and show up
    as dead letters).

    ``spec_drift`` is what the simulator's ``/v1/openapi.json`` serves at start (``none``,
    ``notice``, ``breaking``; ``sim.spec_drift`` changes it later); ``spec_check_minutes`` how
    often the receiver reads it (``api.spec_check_minutes``, default: only at start).
    """

    def __init__(
        self, directory: Path, *, spec_drift: str = "none", spec_check_minutes: float = 0
    ) -> None:
        self.directory = directory
        self.spec_check_minutes = spec_check_minutes
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        #: Unhandled errors of tasks on the stack's loop; the tests assert there are none.
        self.loop_errors: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda _loop, context: self.loop_errors.append(context))
        self._runners: list[web.AppRunner] = []
        self.sim = Simulator(api_key=API_KEY, seed=5)
        self.sim.spec_drift = spec_drift
        self.sender = WebhookSender(self.sim)
        self.consumer = Capture()
        self.archive = Capture()
        self.archive.status = 503
        self.receiver: ReceiverProcess | None = None
        self.ops_url = ""

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run ``coro`` on the stack's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> None:
        self._thread.start()
        sim_url = self.call(self._serve(self.sim.create_app()))
        self.sim.base_url = f"{sim_url}/v1"
        consumer_url = self.call(self._serve(self.consumer.app()))
        archive_url = self.call(self._serve(self.archive.app()))
        public, ops = free_port(), free_port()
        self.ops_url = f"http://127.0.0.1:{ops}"
        config = write_config(
            self.directory / "receiver.toml",
            {
                "server": {"host": "127.0.0.1", "port": public},
                "webhook": {"secrets": [WEBHOOK_SECRET]},
                "api": {
                    "base_url": self.sim.base_url,
                    "api_key": API_KEY,
                    "timeout_seconds": 5,
                    "watchdog_interval_seconds": 2,
                    "spec_check_minutes": self.spec_check_minutes,
                },
                "store": {"url": "sqlite:///data/inbox.db"},
                "worker": {
                    "backoff_initial_seconds": 0.1,
                    "backoff_max_seconds": 0.2,
                    "poll_interval_seconds": 0.1,
                },
                "admin": {"host": "127.0.0.1", "port": ops, "token": ADMIN_TOKEN},
                "log": {"format": "json"},
                "sinks": [
                    {
                        "name": "consumer",
                        "type": "http",
                        "url": f"{consumer_url}/in",
                        "secret": SINK_SECRET,
                    },
                    {
                        "name": "archive",
                        "type": "http",
                        "url": f"{archive_url}/archive",
                        "secret": SINK_SECRET,
                        "events": ["job.failed"],
                        "max_attempts": 2,
                    },
                ],
            },
        )
        self.receiver = ReceiverProcess(config)
        self.receiver.start()
        self.call(self.receiver.wait_ready())
        self.sim.add_webhook(f"http://127.0.0.1:{public}/webhooks", secret=WEBHOOK_SECRET)
        self.call(self.sender.start())

    async def _serve(self, app: web.Application) -> str:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        self._runners.append(runner)
        return f"http://127.0.0.1:{port}"

    def send(
        self, kind: str = "image", *, extra: dict[str, Any] | None = None, **job: Any
    ) -> dict[str, Any]:
        """A new job of ``kind`` at the simulator, its webhook sent (signed) to the receiver;
        returns the webhook payload once the receiver has answered it. ``extra`` adds fields to
        the body (the upstream guarantees only four; workflows add others)."""

        async def publish() -> dict[str, Any]:
            if kind == "failed":
                payload = self.sim.add_failed_job(**job)
            else:
                payload = self.sim.add_job(kind, **job)
            payload.update(extra or {})
            self.sender.publish(payload)
            await self.sender.wait_settled()
            return payload

        return self.call(publish())

    def consumer_got(self, event_id: str) -> int:
        """How many times the consumer sink was sent ``event_id``."""
        return sum(
            1 for r in list(self.consumer.requests) if json.loads(r.body)["event"]["id"] == event_id
        )

    def stop(self) -> None:
        if self.receiver is not None:
            self.receiver.stop()
        if self._thread.is_alive():
            self.call(self._close())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        self.loop.close()

    async def _close(self) -> None:
        await self.sender.close()
        for runner in self._runners:
            await runner.cleanup()

    def log(self) -> str:
        return self.receiver.log() if self.receiver is not None else ""


@contextlib.contextmanager
def running(directory: Path, **options: Any) -> Iterator[Stack]:
    """A started :class:`Stack` (``options`` as its own), stopped at exit; its receiver's log is
    printed when the body fails, and the stack's loop must have recorded no unhandled error."""
    stack = Stack(directory, **options)
    try:
        stack.start()
        yield stack
    except BaseException:
        print(stack.log())
        raise
    finally:
        stack.stop()
    assert stack.loop_errors == [], stack.loop_errors
