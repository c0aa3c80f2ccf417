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


def refused_to_start(exc: BaseException) -> bool:
    """Whether the driver refused to start a statement because the connection is still busy with
    an earlier operation: one that will never end when the server has ended the connection and
    the driver has read why but not yet the end of the stream. Nothing of the new statement was
    sent (the driver checks its state first); asyncpg says so only in the message."""
    if isinstance(exc, asyncpg.InternalClientError):
        return "another operation" in str(exc)
    return type(exc) is asyncpg.InterfaceError and "another operation is in progress" in str(exc)
