"""The ``pg_dump`` and ``pg_restore`` commands that back up and restore a Postgres inbox: its
schema, as one custom-format archive. ``receiver backup`` prints them for the configured store;
docs/operations.md shows the same.

The database URL is printed as configured, user, host, port, database and parameters, without
its password: ``pg_dump`` and ``pg_restore`` read that from ``PGPASSWORD`` or ``~/.pgpass``.
"""

from __future__ import annotations

import shlex
from urllib.parse import parse_qsl, urlencode, urlsplit

from receiver.config.settings import StoreSettings


def pg_commands(settings: StoreSettings) -> list[str]:
    """The lines ``receiver backup`` prints for a Postgres inbox: comments and the two
    commands."""
    url, had_password = without_password(settings.url)
    schema = settings.schema or _schema_on_search_path(settings)
    archive = f"inbox-{schema}.dump"
    dbname = "--dbname=" + shlex.quote(url)
    lines = [
        f"# back up the inbox (schema {schema}) while the receivers run: one consistent snapshot",
        f"pg_dump {dbname} --schema={shlex.quote(schema)} --format=custom "
        f"--file={shlex.quote(archive)}",
        "# restore it: stop every receiver on this schema, then (its tables are dropped and "
        "created again, in one transaction)",
        f"pg_restore {dbname} --clean --if-exists --single-transaction --exit-on-error "
        f"{shlex.quote(archive)}",
    ]
    if had_password:
        lines.append(
            "# the password is left out of the URL: both read it from PGPASSWORD or ~/.pgpass"
        )
    return lines


def without_password(url: str) -> tuple[str, bool]:
    """``url`` without its password (in the user part or as a ``password`` parameter), and
    whether it had one."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    params = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(key, value) for key, value in params if key != "password"]
    netloc = f"{user}@{hostport}" if at and user else hostport
    query = urlencode(kept, safe="/:")
    had_password = bool(colon) or len(kept) != len(params)
    # Written out, not urlunsplit: that drops the empty host of postgresql:///db?host=/socket.
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else ""), had_password


def _schema_on_search_path(settings: StoreSettings) -> str:
    """The schema the inbox's tables are in when ``store.schema`` is empty: the first on the
    server's search_path, as the receiver finds it."""
    from receiver.cli.common import run_async
    from receiver.store import open_store
    from receiver.store.postgres import PostgresStore

    store = open_store(settings)  # a ConfigError names a missing optional extra
    assert isinstance(store, PostgresStore)
    schema, _version = run_async(store.schema_version())
    return str(schema)
