"""``receiver migrate``: where the inbox's schema stands, what would change, and the upgrade,
without starting a receiver.

:func:`schema_status` only reads (a SQLite file that does not exist is not created);
:func:`migrate_store` applies every pending migration, in one transaction, whatever
``store.auto_migrate`` says. An inbox a newer release wrote is
:class:`~receiver.errors.StoreNewer` for both, and is left as it was.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from receiver.config.settings import StoreSettings
from receiver.errors import StoreNewer
from receiver.logs import redact_url
from receiver.store import open_store
from receiver.store.sql.versions import pending

#: How long reading a SQLite inbox's version waits for another process's lock.
SQLITE_BUSY_SECONDS = 5.0


@dataclass(frozen=True)
class SchemaStatus:
    """Where an inbox's schema stands against this release's.

    ``inbox`` is its url (without a password; on Postgres, with the schema), ``named`` the
    inbox as error messages name it; ``version``
    is 0 for an inbox without a schema yet; ``exists`` is false for a SQLite file not made
    yet; ``copy_before`` is where a SQLite inbox's copy would go before migrating (None when
    none is written: a new inbox, or nothing pending)."""

    inbox: str
    named: str
    version: int
    latest: int
    exists: bool = True
    copy_before: str | None = None

    @property
    def pending(self) -> tuple[tuple[int, str], ...]:
        """The migrations ``receiver migrate`` would apply: (version, description)."""
        return pending(self.version, self.latest)

    @property
    def newer(self) -> bool:
        """Whether a newer release wrote the inbox (this one does not open it)."""
        return self.version > self.latest

    def refusal(self) -> StoreNewer:
        """The error a command that opens this inbox ends with, when a newer release wrote it."""
        return StoreNewer(self.named, self.version, self.latest)


@dataclass(frozen=True)
class Migrated:
    """What :func:`migrate_store` did: versions before and after, those applied, and the copy of
    a SQLite inbox written before (its path)."""

    inbox: str
    before: int
    after: int
    applied: tuple[int, ...]
    backup: Path | None = None


def in_memory(settings: StoreSettings) -> bool:
    """A ``memory://`` inbox: kept in the receiver's process, nothing to migrate."""
    return settings.url.startswith("memory://")


async def schema_status(settings: StoreSettings) -> SchemaStatus:
    """Read the schema version of the inbox ``settings.url`` names; changes nothing."""
    if settings.url.startswith("sqlite:"):
        from receiver.store.sqlite import SCHEMA_VERSION, sqlite_path
        from receiver.store.sqlite.backup_copy import copy_name
        from receiver.store.sqlite.faults import _unavailable
        from receiver.store.sqlite.migrate import COPY_KIND, named, read_version

        path = sqlite_path(settings.url)
        try:
            found = await asyncio.to_thread(read_version, path, SQLITE_BUSY_SECONDS)
        except (sqlite3.Error, OSError) as exc:
            raise _unavailable(exc, path) from exc
        version = found or 0
        copy = None
        if 0 < version < SCHEMA_VERSION:
            copy = str(copy_name(path, f"{COPY_KIND}-v{version}", "<UTC time>"))
        return SchemaStatus(
            settings.url, named(path), version, SCHEMA_VERSION, found is not None, copy
        )

    store = open_store(settings)  # a ConfigError names a missing optional extra
    from receiver.store.postgres import SCHEMA_VERSION as PG_VERSION
    from receiver.store.postgres import PostgresStore

    assert isinstance(store, PostgresStore)
    schema, version = await store.schema_version()
    inbox = f"{redact_url(settings.url)} (schema {schema})"
    return SchemaStatus(inbox, store.inbox, version, PG_VERSION)


async def migrate_store(settings: StoreSettings) -> Migrated:
    """Bring the inbox ``settings.url`` names to this receiver's schema.

    Applies migrations whatever ``store.auto_migrate`` says. Postgres migrations run under an
    advisory lock, so this is safe while replicas start or run; SQLite migrates on open, in
    the writers' turn of the processes sharing the file."""
    settings = dataclasses.replace(settings, auto_migrate=True)
    store = open_store(settings)  # a ConfigError names a missing optional extra
    if settings.url.startswith("sqlite:"):
        from receiver.store.sqlite import SCHEMA_VERSION, SqliteStore

        assert isinstance(store, SqliteStore)
        await store.open()
        await store.close()
        done = store.migration
        if done is None or not done.applied:
            return Migrated(settings.url, SCHEMA_VERSION, SCHEMA_VERSION, ())
        return Migrated(settings.url, done.before, done.after, done.applied, done.backup)

    from receiver.store.postgres import PostgresStore

    assert isinstance(store, PostgresStore)
    report = await store.migrate()
    inbox = f"{redact_url(settings.url)} (schema {report.schema})"
    return Migrated(inbox, report.before, report.after, report.applied)
