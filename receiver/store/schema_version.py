"""The inbox schema version this release writes, the same number on every store.

Each backend numbers its migrations from 1 (``receiver.store.sqlite.MIGRATIONS``,
``receiver.store.postgres.MIGRATIONS``) and derives its own ``SCHEMA_VERSION`` from them; both
equal this one. A release that adds a migration raises it, and is at least a minor release
(docs/development.md, "Releases"). This module imports nothing, so ``receiver --version`` and
the metrics can name the schema without loading a store.
"""

from __future__ import annotations

SCHEMA_VERSION = 9
