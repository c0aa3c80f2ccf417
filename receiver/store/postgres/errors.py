"""The driver errors that mean the Postgres inbox cannot be used right now."""

from __future__ import annotations

import asyncpg

# Errors that mean "Postgres cannot be used right now", never a bug in the caller's data.
_DB_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)
_CONFLICTS = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)
