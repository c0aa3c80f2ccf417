"""How settings are shown (``receiver check-config``): the keys that differ from their
defaults, with secrets, URL passwords and query strings masked."""

from __future__ import annotations

from typing import Any

from receiver.config.settings import Settings, schema


def changed_from_defaults(settings: Settings) -> list[str]:
    """``section.key = value`` for every key whose value is not its default, secrets masked."""
    lines = []
    for section in schema():
        tables = getattr(settings, section.name)
        for index, table in enumerate(tables if section.many else (tables,)):
            where = f"{section.name}[{index}]" if section.many else section.name
            for k in section.keys.values():
                value = getattr(table, k.name)
                if k.required or value != k.default:
                    lines.append(f"{where}.{k.name} = {_shown(value, secret=k.secret)}")
    return lines


def _shown(value: Any, *, secret: bool) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(_shown(v, secret=secret) for v in value) + "]"
    if secret:
        return masked(str(value))
    if isinstance(value, str):
        return '"' + masked_url(value) + '"'
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def masked_url(url: str) -> str:
    """A URL with its password and its query string (which may sign or authenticate) masked."""
    url, query, _ = url.partition("?")
    if query:
        return masked_url(url) + "?****"
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        creds, _, host = rest.rpartition("@")
        user = creds.split(":", 1)[0]
        return f"{scheme}{sep}{user}:****@{host}"
    return url


def masked(value: str) -> str:
    """A secret as it may be shown: its length and last two characters at most."""
    if not value:
        return "(unset)"
    if len(value) <= 8:
        return "****"
    return f"****{value[-2:]} ({len(value)} chars)"
