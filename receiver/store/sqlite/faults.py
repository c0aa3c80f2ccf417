"""How :mod:`receiver.store.sqlite` tells a fault of the database file from a bad value."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import aiosqlite

from receiver.errors import StoreUnavailable


def _is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` says only that another connection held the lock (the connection that
    got it is as good as before: nothing of the file is wrong)."""
    return str(getattr(exc, "sqlite_errorname", "")).startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))


def _unavailable(exc: BaseException, path: Path) -> StoreUnavailable:
    """A short, driver-free message for what went wrong with the database file."""
    name = str(getattr(exc, "sqlite_errorname", ""))
    if _is_busy(exc):
        message = f"the inbox database {path} is locked by another writer"
    elif name.startswith("SQLITE_READONLY"):
        message = f"the inbox database {path} is read-only"
    elif name == "SQLITE_FULL":
        message = f"the disk holding the inbox database {path} is full"
    elif name.startswith("SQLITE_CANTOPEN"):
        message = f"the inbox database {path} cannot be opened"
    elif name.startswith("SQLITE_IOERR"):
        message = f"disk I/O error on the inbox database {path}"
    elif name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        message = f"the inbox database {path} is corrupt or not a SQLite database"
    elif isinstance(exc, OSError):
        message = f"cannot create the directory for the inbox database {path}: {exc.strerror}"
    else:
        message = f"the inbox database {path} failed: {exc}"
    err = StoreUnavailable(message)
    err.__cause__ = exc
    return err


# Errors that mean "the database file is not usable right now", never a bug in this module.
_DB_ERRORS = (sqlite3.Error, OSError)
# Errors that come from one statement's arguments, not from the file: they fail only the event
# (or job) that caused them. A str with a lone surrogate cannot be encoded for SQLite at all.
_ITEM_ERRORS = (
    sqlite3.IntegrityError,
    sqlite3.ProgrammingError,
    sqlite3.InterfaceError,
    sqlite3.DataError,
    sqlite3.NotSupportedError,
    UnicodeEncodeError,
)


async def _close_quietly(conn: aiosqlite.Connection) -> None:
    with contextlib.suppress(sqlite3.Error, ValueError):
        await conn.close()
