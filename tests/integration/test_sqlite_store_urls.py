"""What only the SQLite inbox promises, its urls: ``sqlite:///`` paths (relative to the working
directory, or absolute), and ``open_store`` choosing the backend by the url's scheme.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from receiver.config.settings import StoreSettings
from receiver.errors import ConfigError
from receiver.store import open_store
from receiver.store.memory import MemoryStore
from receiver.store.sqlite import SqliteStore, sqlite_path
from tests.support.sqlite_stores import new_event

# -- urls ---------------------------------------------------------------------------------------


def test_sqlite_urls() -> None:
    assert sqlite_path("sqlite:///data/receiver.db") == Path("data/receiver.db")
    assert sqlite_path("sqlite:///receiver.db") == Path("receiver.db")
    assert sqlite_path("sqlite:////var/lib/receiver/inbox.db") == Path("/var/lib/receiver/inbox.db")
    for bad in ("sqlite://", "sqlite:///", "sqlite://host/x.db", "sqlite:///:memory:"):
        with pytest.raises(ConfigError, match=r"store\.url"):
            sqlite_path(bad)


async def test_open_store_relative_url_is_under_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store(StoreSettings(url="sqlite:///data/sub/receiver.db"))
    assert isinstance(store, SqliteStore)
    await store.open()
    try:
        await store.add_event(new_event("ev-1"))
    finally:
        await store.close()
    assert (tmp_path / "data" / "sub" / "receiver.db").exists()


async def test_open_store_absolute_url(tmp_path: Path) -> None:
    target = tmp_path / "abs" / "inbox.db"
    store = open_store(StoreSettings(url=f"sqlite:///{target}"))
    assert isinstance(store, SqliteStore)
    assert store.path == target
    await store.open()
    await store.close()
    assert target.exists()


def test_open_store_other_schemes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(open_store(StoreSettings(url="memory://")), MemoryStore)
    with pytest.raises(ConfigError, match=r"store\.url"):
        open_store(StoreSettings(url="mysql://localhost/db"))
    # Without the optional library, the error names the extra to install.
    monkeypatch.setitem(sys.modules, "receiver.store.postgres", None)
    for url in ("postgresql://localhost/db", "postgres://localhost/db"):
        with pytest.raises(ConfigError, match=r"pip install 'receiver\[postgres\]'"):
            open_store(StoreSettings(url=url))
