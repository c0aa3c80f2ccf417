"""The Postgres inbox (``receiver[postgres]``): :class:`PostgresStore` (:mod:`.store`) and its
parts, one module per concern, each named as its twin in the other backends (``lanes``,
``pull``, ``browse``, ``schema``, ...)."""

# The optional extra, asked for first: without it this package fails to import, however many
# of its modules an earlier import left loaded (receiver.store.open_store names the extra).
import asyncpg  # noqa: F401

from receiver.store.postgres.conn import CHANNEL
from receiver.store.postgres.migrate import MigrationReport
from receiver.store.postgres.schema import MIGRATIONS, SCHEMA_VERSION, Migration
from receiver.store.postgres.store import PostgresStore

__all__ = [
    "CHANNEL",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Migration",
    "MigrationReport",
    "PostgresStore",
]
