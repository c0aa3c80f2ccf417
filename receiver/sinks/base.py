"""The sink interface: the protocol every sink implements and the context sinks share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import aiohttp

from receiver.config.settings import Settings, SinkSettings
from receiver.events import Enriched
from receiver.observe.metrics import Metrics


@dataclass(frozen=True)
class SinkContext:
    """What sinks may share: the process-wide settings, HTTP session and metrics."""

    settings: Settings
    session: aiohttp.ClientSession
    metrics: Metrics | None = None


class Sink(Protocol):
    """A destination for enriched events.

    ``send`` either returns (the delivery is done) or raises a
    :class:`~receiver.errors.DeliveryError`: ``TransientError`` to retry with backoff (its
    ``retry_after`` is honoured), ``PermanentError`` to mark the delivery dead at once. Any other
    exception is treated as transient. ``send`` may be called concurrently, up to the sink's
    ``concurrency``, and again for the same event (redelivery, a crash before settling): it should
    be idempotent where the destination allows.
    """

    name: str
    settings: SinkSettings

    async def open(self) -> None:
        """Connect; called once before the first ``send``."""

    async def send(self, enriched: Enriched) -> int | None:
        """Deliver one event; the destination's HTTP status where it answers with one (for the
        event's timeline), else None."""

    async def close(self) -> None:
        """Disconnect; called once at shutdown."""
