"""The upstream's "wait before asking again", kept for every request of one API client.

The spec's Errors, rule 2: "After a 429, clients wait for ``Retry-After`` when present". A 429
with ``Retry-After`` says so of the client, not of the one request that got it: until that
moment no request of the same client is sent. A request asked for within the last second of the
wait sleeps it out and goes; one asked for earlier is not sent at all and fails at once as the
same transient 429, carrying the time left, so the event (or the poll, or the command) is tried
again when the wait is over and holds no claim meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from receiver.errors import TransientError
from receiver.retry import MAX_RETRY_AFTER_SECONDS

#: Waits this short are slept out rather than failed (a clock tick, a Retry-After of 1).
SLEEP_OUT_SECONDS = 1.0


class RetryAfterGate:
    """Closed from a 429's ``Retry-After`` until that moment has passed."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._open_at = 0.0

    def remaining(self) -> float:
        """Seconds until requests may be sent again (0 when they may now)."""
        return max(0.0, self._open_at - self._clock())

    def close_for(self, seconds: float) -> None:
        """The upstream asked to wait ``seconds`` (at most a day is honoured)."""
        self._open_at = max(self._open_at, self._clock() + min(seconds, MAX_RETRY_AFTER_SECONDS))

    async def pass_through(self, what: str) -> None:
        """Return once a request for ``what`` may be sent; raise TransientError (429, with the
        time left as its ``retry_after``) if that is more than :data:`SLEEP_OUT_SECONDS` away."""
        wait = self.remaining()
        if wait <= 0:
            return
        if wait <= SLEEP_OUT_SECONDS:
            await asyncio.sleep(wait)
            return
        raise TransientError(
            f"not asking the upstream for {what}: it asked to wait {wait:.1f} s more (Retry-After)",
            retry_after=wait,
            status=429,
        )
