"""SQLite stores for the tests of what only the SQLite inbox promises
(tests/integration/test_sqlite_store_*.py): events with one sink, settings for an inbox file,
and ``opened``, a store open on a file for the time of an ``async with``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from receiver.config.settings import StoreSettings
from receiver.store import NewEvent
from receiver.store.sqlite import SqliteStore

T0 = 1_700_000_000.0


def new_event(event_id: str, *, sinks: tuple[str, ...] = ("alpha",)) -> NewEvent:
    return NewEvent(
        id=event_id,
        event="job.completed",
        job_id="job-1",
        body=b'{"id": "%s"}' % event_id.encode(),
        headers={},
        received_at=T0,
        sinks=sinks,
    )


def settings_for(path: Path, **overrides: object) -> StoreSettings:
    return StoreSettings(url=f"sqlite:///{path}", **overrides)  # type: ignore[arg-type]


@asynccontextmanager
async def opened(path: Path, **kwargs: object) -> AsyncIterator[SqliteStore]:
    synchronous = str(kwargs.pop("synchronous", "full"))
    store = SqliteStore(settings_for(path, synchronous=synchronous), **kwargs)  # type: ignore[arg-type]
    await store.open()
    try:
        yield store
    finally:
        await store.close()
