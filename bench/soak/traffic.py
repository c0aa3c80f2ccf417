"""The soak's webhooks: ``rate`` a second, each a distinct event, and how they were answered."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

from bench.common import SECRET
from receiver.signature import webhook_headers

#: Webhooks awaiting their answer at most; beyond, the sender waits (and falls behind).
MAX_IN_FLIGHT = 256


def soak_event(run: str, n: int) -> tuple[str, bytes]:
    """Event ``n`` of a run: a ``logo`` job the stub upstream serves (its asset ``ast-<job>``),
    UUID ids random in order as the upstream's are; its id and body."""
    digest = hashlib.sha256(f"soak-{run}-{n}".encode()).digest()
    event_id = str(uuid.UUID(bytes=digest[:16], version=4))
    job_id = str(uuid.UUID(bytes=digest[16:], version=4))
    asset_id = f"ast-{job_id}"
    body = {
        "id": event_id,
        "object": "event",
        "event": "job.completed",
        "job_id": job_id,
        "type": "logo",
        "asset_ids": {"logo": asset_id},
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
    }
    return event_id, json.dumps(body, separators=(",", ":")).encode()


@dataclass
class Traffic:
    """What the sender sent and how the receiver answered."""

    sent: int = 0
    ok: int = 0
    statuses: Counter[int] = field(default_factory=Counter)  # the non-2xx answers
    errors: Counter[str] = field(default_factory=Counter)  # no answer: the exception's type
    #: The largest delay of a webhook behind its schedule (the in-flight cap reached), seconds.
    behind: float = 0.0

    @property
    def non_2xx(self) -> int:
        return sum(self.statuses.values())

    @property
    def failed(self) -> int:
        return sum(self.errors.values())


async def send_steady(url: str, rate: float, seconds: float, traffic: Traffic) -> None:
    """POST ``rate`` signed, distinct webhooks a second for ``seconds``; each answer counted."""
    loop = asyncio.get_running_loop()
    run = uuid.uuid4().hex
    slots = asyncio.Semaphore(MAX_IN_FLIGHT)
    tasks: set[asyncio.Task[None]] = set()

    async def post(session: aiohttp.ClientSession, n: int) -> None:
        try:
            event_id, body = soak_event(run, n)
            headers = webhook_headers(
                SECRET, body, int(time.time()), event_id=event_id, event_name="job.completed"
            )
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                if 200 <= response.status < 300:
                    traffic.ok += 1
                else:
                    traffic.statuses[response.status] += 1
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            traffic.errors[type(exc).__name__] += 1
        finally:
            slots.release()

    connector = aiohttp.TCPConnector(limit=MAX_IN_FLIGHT)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = loop.time()
        n = 0
        while (due := start + n / rate) < start + seconds:
            if (delay := due - loop.time()) > 0:
                await asyncio.sleep(delay)
            await slots.acquire()
            traffic.behind = max(traffic.behind, loop.time() - due)
            task = asyncio.create_task(post(session, n))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            traffic.sent += 1
            n += 1
        if tasks:
            await asyncio.gather(*tasks)
