"""Fixtures every test gets. Shared helpers live in :mod:`tests.support`."""

from __future__ import annotations

import pytest


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


@pytest.fixture(autouse=True)
def restore_structlog_config():
    """A command run in-process may set the logs' level or chain for its process (``quiet_logs``,
    ``configure_logging``): every test starts from, and leaves, the configuration it found, so
    a later ``capture_logs()`` sees every line."""
    import structlog

    saved = dict(structlog.get_config())
    yield
    structlog.configure(**saved)
