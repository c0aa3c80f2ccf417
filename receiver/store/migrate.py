"""``receiver migrate``: create or upgrade the inbox schema without starting a receiver."""

from __future__ import annotations

import dataclasses

from receiver.config.settings import StoreSettings
from receiver.logs import redact_url
from receiver.store import open_store


async def migrate_store(settings: StoreSettings) -> str:
    """Bring the inbox ``settings.url`` names to this receiver's schema; a one-line report.

    Applies migrations whatever ``store.auto_migrate`` says. Postgres migrations run under an
    advisory lock, so this is safe while replicas start or run. SQLite migrates on open.
    """
    settings = dataclasses.replace(settings, auto_migrate=True)
    store = open_store(settings)  # a ConfigError names a missing optional extra
    if settings.url.startswith("memory://"):
        return "inbox memory://: kept in memory, nothing to migrate"
    if settings.url.startswith("sqlite:"):
        from receiver.store.sqlite import SCHEMA_VERSION

        await store.open()
        await store.close()
        return f"inbox {settings.url}: schema at version {SCHEMA_VERSION}"

    from receiver.store.postgres import PostgresStore

    assert isinstance(store, PostgresStore)
    where = redact_url(settings.url)  # no password
    report = await store.migrate()
    if not report.applied:
        return f"inbox {where} (schema {report.schema}): already at version {report.after}"
    applied = ", ".join(str(v) for v in report.applied)
    return (
        f"inbox {where} (schema {report.schema}): migrated from version {report.before} "
        f"to {report.after} (applied {applied})"
    )
