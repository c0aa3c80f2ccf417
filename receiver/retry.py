"""Retry decisions: a pure function of the error, the attempts made and a random source; and
the reading of a `Retry-After` header, which feeds them."""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING

from receiver.errors import PermanentError, VersionRefused

if TYPE_CHECKING:
    from receiver.config.settings import WorkerSettings

# An upstream Retry-After is honoured up to a day; beyond that it is more likely a mistake.
MAX_RETRY_AFTER_SECONDS = 24 * 3600.0
# Doublings beyond this change nothing (the wait is capped long before) and would overflow.
_MAX_DOUBLINGS = 64
_SECONDS = re.compile(r"\d+(\.\d+)?")


@dataclass(frozen=True)
class Decision:
    """Retry after ``delay`` seconds, or give up (``dead``) with ``reason``."""

    dead: bool
    delay: float = 0.0
    reason: str = ""


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, capped, with a limit on attempts.

    The n-th retry waits about ``initial * 2**(n-1)`` seconds (between half and all of it, so
    retries of many events spread out), never more than ``maximum``, unless the error carries a
    longer ``retry_after``, which wins.
    """

    initial: float
    maximum: float
    max_attempts: int
    rng: random.Random = field(default_factory=random.Random, compare=False)

    @classmethod
    def for_worker(cls, worker: WorkerSettings, max_attempts: int | None = None) -> RetryPolicy:
        """The ``[worker]`` backoff, giving up after ``max_attempts`` (``worker.max_attempts``
        by default)."""
        return cls(
            initial=worker.backoff_initial_seconds,
            maximum=worker.backoff_max_seconds,
            max_attempts=worker.max_attempts if max_attempts is None else max_attempts,
        )

    def backoff(self, attempts: int) -> float:
        """The jittered wait after ``attempts`` failed attempts."""
        base = min(self.maximum, self.initial * 2.0 ** min(max(0, attempts - 1), _MAX_DOUBLINGS))
        return base / 2 + self.rng.uniform(0, base / 2)

    def decide(self, error: BaseException, attempts: int) -> Decision:
        """What to do after the ``attempts``-th attempt failed with ``error``."""
        message = str(error) or type(error).__name__
        if isinstance(error, PermanentError):
            return Decision(dead=True, reason=message)
        # A refused api.version is the receiver's configuration, not the event: it waits for
        # the fix however long that takes, never dead.
        if attempts >= self.max_attempts and not isinstance(error, VersionRefused):
            return Decision(dead=True, reason=f"gave up after {attempts} attempts: {message}")
        delay = self.backoff(attempts)
        retry_after = getattr(error, "retry_after", None)
        if retry_after is not None:
            delay = max(delay, min(float(retry_after), MAX_RETRY_AFTER_SECONDS))
        return Decision(dead=False, delay=delay, reason=message)


def parse_retry_after(value: str | None, *, now: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delta-seconds or an HTTP date.

    A date in the past gives 0; a missing or unparseable value gives ``None``.
    """
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    if _SECONDS.fullmatch(value):
        seconds = float(value)
        return seconds if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now())
