"""The browser tests are synchronous: Playwright's sync API keeps its own event loop running in
the test thread, so no asyncio fixture may run there. The receiver's peers run on the stack's
loop in another thread, which records unhandled task errors itself (see tests/web/stack.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def fail_on_unhandled_task_errors():
    """Replaces the suite's asyncio version for these synchronous tests."""
    yield
