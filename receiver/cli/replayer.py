"""``receiver replay``: sign payloads with a fresh timestamp and POST them to a receiver.

Payloads come from files (``PATH...``) or from the inbox (``--from-store EVENT_ID...``: the exact
bytes once received, for a receiver elsewhere such as staging). Each is signed anew by a
:class:`receiver.signature.Signer` (the upstream's ``Service-Signature``, or Standard Webhooks to
try a consumer of the http sink), so a ±300 s tolerance is met however old the event is.
Results go to a :class:`Progress`: one line per payload when the output is not a terminal
(scripts, CI), a bar redrawn in place when it is (with a line for each refusal).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from typing import TextIO

import aiohttp

from receiver.cli.signing import payload_fields
from receiver.config.settings import Settings
from receiver.errors import UnknownEvent
from receiver.signature import Signer

_BAR_WIDTH = 30


class Progress:
    """Where replay reports. ``tty=None`` asks the stream whether it is a terminal."""

    def __init__(self, total: int, *, stream: TextIO | None = None, tty: bool | None = None):
        self.total = total
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.done = 0
        self.refused = 0

    def result(self, line: str, *, ok: bool) -> None:
        """One payload's outcome: printed as a line (on a terminal only refusals are)."""
        self.done += 1
        self.refused += not ok
        if not self.tty:
            print(line, file=self.stream, flush=True)
            return
        if not ok:
            self.stream.write("\r\x1b[K" + line + "\n")
        self._draw()

    def finish(self) -> None:
        """The closing count line (the bar is replaced by it on a terminal)."""
        if self.tty:
            self.stream.write("\r\x1b[K")
        accepted = self.done - self.refused
        print(f"{self.done} sent, {accepted} accepted, {self.refused} refused", file=self.stream)
        self.stream.flush()

    def _draw(self) -> None:
        filled = _BAR_WIDTH * self.done // max(1, self.total)
        bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
        self.stream.write(
            f"\r\x1b[K[{bar}] {self.done}/{self.total}  "
            f"accepted {self.done - self.refused}  refused {self.refused}"
        )
        self.stream.flush()


async def replay(
    url: str,
    signer: Signer,
    payloads: Sequence[tuple[str, bytes]],
    *,
    concurrency: int = 4,
    timeout: float = 10.0,
    progress: Progress | None = None,
) -> int:
    """POST each ``(label, body)`` signed with a fresh timestamp; returns how many were refused.

    At most ``concurrency`` requests are in flight; ``timeout`` bounds each one.
    """
    progress = progress or Progress(len(payloads))
    slots = asyncio.Semaphore(max(1, concurrency))

    async def send(session: aiohttp.ClientSession, label: str, body: bytes) -> None:
        event_id, name = payload_fields(body)
        async with slots:
            headers = signer.headers(body, int(time.time()), event_id=event_id, event_name=name)
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    text = await response.text()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                progress.result(
                    f"ERR  {label}  {type(exc).__name__}: {exc or 'timed out'}", ok=False
                )
                return
        ok = 200 <= status < 300
        detail = event_id or "-"
        if not ok:
            try:
                detail += "  " + json.loads(text)["error"]["code"]
            except (ValueError, KeyError, TypeError):
                detail += "  " + text[:80]
        elif '"duplicate":true' in text.replace(" ", ""):
            detail += "  (duplicate)"
        progress.result(f"{status}  {label}  {detail}", ok=ok)

    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(timeout=client_timeout) as session:
        await asyncio.gather(*(send(session, label, body) for label, body in payloads))
    progress.finish()
    return progress.refused


async def stored_payloads(settings: Settings, event_ids: Sequence[str]) -> list[tuple[str, bytes]]:
    """The raw bodies of these inbox events, labelled ``inbox:<event name>``.

    Raises UnknownEvent naming the first id the inbox does not have (nothing is sent then).
    """
    from receiver.store import open_existing_store

    store = open_existing_store(settings.store, source=settings.source)
    await store.open()
    try:
        payloads = []
        for event_id in dict.fromkeys(event_ids):
            record = await store.get(event_id)
            if record is None:
                raise UnknownEvent(f"no event {event_id} in the inbox")
            payloads.append((f"inbox:{record.event}", record.body))
        return payloads
    finally:
        await store.close()
