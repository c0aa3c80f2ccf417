"""The two inboxes of a copy, as ``--from`` and ``--to`` name them.

``sqlite:///relative/path.db`` (relative to the working directory) or ``sqlite:////abs/path.db``;
``postgresql://user@host:port/database``, with ``?schema=NAME`` for the schema holding the inbox
tables (without it, the role's ``search_path``). A password in a Postgres url is never shown:
messages name the url without it (``PGPASSWORD`` or a ``~/.pgpass`` file keep it off the
command line altogether).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, urlencode, urlsplit

from receiver.config.settings import StoreSettings
from receiver.errors import ConfigError
from receiver.logs import redact_url

Kind = Literal["sqlite", "postgres"]


class BadLocation(ValueError):
    """A ``--from`` or ``--to`` that names no inbox this command copies."""


@dataclass(frozen=True)
class Location:
    """One side of a copy.

    ``option`` is the command line option that named it; ``url`` is what connects (a Postgres
    password included, never shown); ``shown`` is the url as output shows it (no password);
    ``settings`` is the store as ``receiver migrate`` would open it."""

    option: str
    kind: Kind
    url: str
    shown: str
    settings: StoreSettings
    path: Path | None = None  # SQLite
    schema: str = ""  # Postgres; "" = the search_path's

    @property
    def named(self) -> str:
        """How messages name it: ``--to postgresql://host/db?schema=receiver``."""
        return f"{self.option} {self.shown}"

    def same_inbox(self, other: Location) -> bool:
        """Whether both name one inbox (the same SQLite file, or one Postgres url and schema)."""
        if self.kind != other.kind:
            return False
        if self.path is not None and other.path is not None:
            return self.path.resolve() == other.path.resolve()
        return (redact_url(self.url), self.schema) == (redact_url(other.url), other.schema)


def parse_location(option: str, url: str) -> Location:
    """The inbox ``url`` names; :class:`BadLocation` says why it names none."""
    if url.startswith("sqlite:"):
        from receiver.store.sqlite import sqlite_path

        try:
            path = sqlite_path(url)
        except ConfigError as exc:
            raise BadLocation(f"{option}: {exc.message.removeprefix('store.url: ')}") from None
        return Location(option, "sqlite", url, url, StoreSettings(url=url), path=path)
    if url.startswith(("postgresql://", "postgres://")):
        return _postgres(option, url)
    if url.startswith("memory://"):
        raise BadLocation(
            f"{option}: a memory:// inbox lives inside a receiver process; "
            "copy a sqlite:// or postgresql:// inbox"
        )
    raise BadLocation(f"{option}: must start with sqlite:// or postgresql://")


def _postgres(option: str, url: str) -> Location:
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        raise BadLocation(f"{option}: not a usable postgresql:// url") from None
    schema = ""
    kept = []
    for name, value in query:
        if name == "schema":
            schema = value
        else:
            kept.append((name, value))
    connect = parts._replace(query=urlencode(kept)).geturl()
    settings = StoreSettings(url=connect, schema=schema)
    problems = settings.problems()
    if problems:
        raise BadLocation(f"{option}: ?schema=: {problems[0].split(': ', 1)[-1]}")
    shown = redact_url(connect) + (f"?schema={schema}" if schema else "")
    return Location(option, "postgres", connect, shown, settings, schema=schema)
