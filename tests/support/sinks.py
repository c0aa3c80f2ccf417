"""Sinks for tests: their settings, and sinks opened for a test and closed after it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from receiver.config.load import parse_settings
from receiver.config.settings import SinkSettings


@contextlib.asynccontextmanager
async def opened_sinks(
    factory: Callable[..., Any],
) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
    """``await make(**kwargs)``: ``factory(**kwargs)``, opened; every one is closed at the end."""
    sinks: list[Any] = []

    async def make(**kwargs: Any) -> Any:
        sink = factory(**kwargs)
        await sink.open()
        sinks.append(sink)
        return sink

    try:
        yield make
    finally:
        for sink in sinks:
            await sink.close()


def sink_settings(name: str, type: str, **options: Any) -> SinkSettings:
    """One sink's checked settings, as ``[[sinks]]`` with these keys gives them."""
    settings = parse_settings(
        {"webhook": {"secrets": ["x"]}, "sinks": [{"name": name, "type": type, **options}]},
        env={},
    )
    return settings.sinks[0]
