"""The SQLite inbox: :class:`SqliteStore` (:mod:`.store`) and its parts, one module per concern,
each named as its twin in the other backends (``lanes``, ``pull``, ``browse``, ``schema``, ...)."""

from receiver.store.sqlite.schema import MIGRATIONS, SCHEMA_VERSION
from receiver.store.sqlite.store import SqliteStore, sqlite_path

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "SqliteStore", "sqlite_path"]
