"""The inbox: where verified webhooks wait to be processed. :func:`open_store` picks a backend.

``memory://`` keeps events in this process (tests); ``sqlite:///relative/path.db`` (relative
to the working directory) or ``sqlite:////abs/path.db`` is the embedded default;
``postgresql://...`` needs the optional ``receiver[postgres]`` extra, imported only then.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from receiver.config.settings import StoreSettings
from receiver.errors import ConfigError, StoreError
from receiver.extras import install_hint
from receiver.store.base import Store
from receiver.store.records import DeliveryRecord, EventRecord, NewEvent, Outcome

__all__ = [
    "DeliveryRecord",
    "EventRecord",
    "NewEvent",
    "Outcome",
    "Store",
    "open_existing_store",
    "open_store",
]

POSTGRES_MISSING = "store.url: the postgres store needs an optional library; "


def open_store(settings: StoreSettings, *, check: bool = False) -> Store:
    """Build (not yet open) the store ``settings.url`` names; call ``await store.open()``.

    ``check`` is for the process that serves (never a command): a SQLite inbox is then checked
    at open, and its indexes rebuilt if they alone are damaged (:mod:`.sqlite.health`)."""
    url = settings.url
    if url.startswith("memory://"):
        from receiver.store.memory import MemoryStore

        return MemoryStore(settings)
    if url.startswith("sqlite:"):
        from receiver.store.sqlite import SqliteStore

        return SqliteStore(settings, check=check)
    if url.startswith(("postgresql://", "postgres://")):
        try:
            module = importlib.import_module("receiver.store.postgres")
        except ImportError as exc:
            # Only a missing optional piece is the user's to fix; any other import error is a bug.
            missing = (exc.name or "").split(".")[0]
            if exc.name == "receiver.store.postgres" or missing == "asyncpg":
                raise ConfigError(POSTGRES_MISSING + install_hint("postgres")) from None
            raise
        store: Store = module.PostgresStore(settings)
        return store
    raise ConfigError("store.url: must start with sqlite://, postgresql:// or memory://")


def open_existing_store(settings: StoreSettings, *, source: str) -> Store:
    """The store of ``settings`` for a command that only reads or edits an inbox: a SQLite
    file that does not exist is a StoreError naming its path (and that a relative path is
    relative to the working directory), never created. ``source`` names the config file."""
    url = settings.url
    if url.startswith("memory://"):
        raise StoreError(
            f"store.url {url} in {source} keeps events inside the receiver process; "
            "this command reads a sqlite:// or postgresql:// inbox"
        )
    if url.startswith("sqlite://"):
        from receiver.store.sqlite import sqlite_path

        path = sqlite_path(url)
        if not path.exists():
            relative = (
                ""
                if path.is_absolute()
                else f" (store.url {url} is relative to the working directory {Path.cwd()})"
            )
            raise StoreError(
                f"no inbox at {path.absolute()}{relative}; run where the receiver runs, or give "
                f"--config (read: {source})"
            )
    return open_store(settings)
