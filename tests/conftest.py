"""Fixtures every test gets. Shared helpers live in :mod:`tests.support`."""

from __future__ import annotations

import gc
import signal
from collections.abc import Iterator

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the commands the tests start. A shell without job control starts a
    background command (``make test &``) with SIGINT ignored, and every process it starts would
    inherit that: ``receiver events tail`` and the walkthrough's commands, which the tests stop
    with SIGINT, would then never stop. A handler (not an ignore) is reset to the default in
    each child."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What exists before the first test runs (every imported module, the collected tests) is
    moved out of the collector's sight: the ``gc.collect()`` after each test then walks only
    what the tests made since, not the whole heap again. No test has run yet, so no task of a
    test is among the frozen objects; each test's garbage is collected after it as before."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """The same at the end of each test module, once its module-scoped fixtures are torn down
    and a full collection has run: what outlives the module (modules imported on the way,
    caches) is frozen too, and the next module's tests no longer walk it after each test."""
    yield
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        gc.collect()
        gc.freeze()


def forget_aiohttp_handlers() -> None:
    """aiohttp keeps the middleware chains of the last 1024 handlers it served (an LRU cache in
    ``aiohttp.web_app``), each holding its application: without this, the apps and upstream
    stand-ins of earlier tests stay alive, and every later ``gc.collect()`` walks them again."""
    from aiohttp import web_app

    cache = getattr(web_app, "_cached_build_middleware", None)
    if cache is not None and hasattr(cache, "cache_clear"):
        cache.cache_clear()


@pytest.fixture(autouse=True)
async def fail_on_unhandled_task_errors():
    """A task that dies with an exception nobody retrieves fails the test that caused it."""
    import asyncio

    loop = asyncio.get_running_loop()
    errors: list[dict] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    yield
    forget_aiohttp_handlers()
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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test``: ``--dist loadgroup``), the tests that share one of our
    module-scoped fixtures (a receiver process, a browser, a Prometheus) run in one worker, so it
    is set up once rather than once in each worker; every other test goes wherever a worker is
    free. (Fixtures of plugins, whose ``baseid`` is empty, do not count.) First among the hooks:
    xdist's own, which reads the groups in each worker, is registered after this file and would
    otherwise run first and see none."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        shared = any(
            defs and defs[-1].scope != "function" and defs[-1].baseid
            for defs in info.name2fixturedefs.values()
        )
        if shared:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.fixture(scope="session", autouse=True)
def xdist_groups_applied(request: pytest.FixtureRequest) -> None:
    """Fail a run whose pytest-xdist did not tag the grouped tests (their ids end in ``@group``
    once it has): each group's fixtures would be set up once in every worker, minutes of the
    suite, with nothing else failing to show it (pytest-dev/pytest-xdist#1386)."""
    if not getattr(request.config.option, "loadgroup", False):
        return
    for item in request.session.items:
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid.rpartition("]")[2]:
            pytest.fail(
                f"pytest-xdist left {item.nodeid} out of its group: this pytest and pytest-xdist "
                "do not work together for --dist loadgroup (see the pytest pin in pyproject.toml)"
            )


@pytest.fixture(scope="session")
def jetstream_anchor() -> Iterator[str | None]:
    """A JetStream stream held for the session (tests.support.jetstream): request it in every
    fixture or test that creates and deletes streams."""
    from tests.support.jetstream import anchor_stream

    with anchor_stream() as name:
        yield name
