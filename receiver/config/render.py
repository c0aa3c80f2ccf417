"""The commented config ``receiver init`` writes, rendered from the config schema.

Every key of every section appears with its default and its one line of help, so the file is
both a working local set-up (the upstream API is ``receiver simulate`` on port 8090, the inbox
SQLite under ``./data``) and the list of what can be set. The webhook secret is fresh each time.
"""

from __future__ import annotations

import json
from typing import Any

from receiver.config.schema import Key
from receiver.config.settings import schema
from receiver.signature import new_standard_webhooks_secret

_HELP_COLUMN = 34

_HEADER = """\
# receiver configuration, written by `receiver init`.
#
# Every key is shown at its default, with one line of help; `receiver check-config` validates
# the file and lists what differs from the defaults. As written, it runs a complete local
# set-up: the upstream API is the local simulator (`receiver simulate --config config.toml`,
# port 8090), the inbox is SQLite under ./data and files land in ./data/downloads.
#
# Secrets may come from the environment instead of this file: RECEIVER_WEBHOOK_SECRETS
# (comma-separated), RECEIVER_API_KEY, RECEIVER_ADMIN_TOKEN, RECEIVER_STORE_URL.
"""

_SINKS = """\
# Sinks: where each processed event goes. More types (redis, amqp, nats, slack, http, exec) and
# their keys: config.example.toml in the project, or docs/sinks.md.
[[sinks]]
name = "files"
type = "download"                 # writes {directory}/{collection_id}/{item_name}/{type}-{id}{ext}
directory = "data/downloads"
events = ["job.completed"]
# The local simulator serves files from 127.0.0.1, a private address; remove this line when the
# API is the real service.
allow_private_networks = true
"""


def new_secret() -> str:
    """A fresh webhook signing secret: 32 random bytes in the ``whsec_<base64>`` form, which a
    Standard Webhooks signer takes too."""
    return new_standard_webhooks_secret()


def render_config(*, secret: str | None = None) -> str:
    """The whole commented config file, with ``secret`` (default: a fresh one)."""
    values = {"webhook.secrets": (secret or new_secret(),)}
    parts = [_HEADER]
    for section in schema():
        if section.many:
            continue  # arrays of tables are optional: documented in config.example.toml
        lines = [_with_help(f"[{section.name}]", _first_line(section.cls.__doc__))]
        for k in section.keys.values():
            lines.append(_key_line(k, values.get(k.path, k.default)))
        parts.append("\n".join(lines) + "\n")
    parts.append(_SINKS)
    return "\n".join(parts)


def _key_line(k: Key, value: Any) -> str:
    hint = k.help + (f" (or ${k.env})" if k.env else "")
    if value is None:
        return _with_help(f"# {k.name} =", hint)
    return _with_help(f"{k.name} = {toml_value(value)}", hint)


def _with_help(text: str, help_text: str) -> str:
    """``text  # help`` in the help column, or the help on a line of its own above a long one."""
    if not help_text:
        return text
    if len(text) >= _HELP_COLUMN - 1 or _HELP_COLUMN + 2 + len(help_text) > 100:
        return f"# {help_text}\n{text}"
    return f"{text.ljust(_HELP_COLUMN - 1)} # {help_text}"


def _first_line(doc: str | None) -> str:
    """The first line of a section's docstring, without its full stop."""
    line = (doc or "").strip().splitlines()[0] if doc else ""
    return line[:-1] if line.endswith(".") and not line.endswith("..") else line


def toml_value(value: Any) -> str:
    """A Python value as TOML (strings, numbers, booleans, lists and tables of those)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {type(value).__name__}")
