"""Shared test helpers.

Tests that need a local service (Postgres, Redis, RabbitMQ, NATS) call :func:`require_service`:
it skips with the reason when the service is absent, unless ``RECEIVER_REQUIRE_SERVICES=1``
(as in CI), where a missing service fails the test instead.
"""

from __future__ import annotations

import os
import socket

import pytest


def service_reachable(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    """Skip (or fail, under RECEIVER_REQUIRE_SERVICES=1) unless host:port accepts connections."""
    if service_reachable(host, port):
        return
    reason = f"{name} is not reachable at {host}:{port}"
    if os.environ.get("RECEIVER_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason} (RECEIVER_REQUIRE_SERVICES=1)")
    pytest.skip(reason)


@pytest.fixture(autouse=True)
async def fail_on_unhandled_task_errors():
    """A task that dies with an exception nobody retrieves fails the test that caused it."""
    import asyncio
    import gc

    loop = asyncio.get_running_loop()
    errors: list[dict] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    yield
    gc.collect()
    loop.set_exception_handler(previous)
    assert not errors, f"unhandled errors in the event loop: {errors}"
