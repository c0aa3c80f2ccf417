"""Reading a config: the TOML file, every section of :mod:`receiver.config.settings` and the
``[[sinks]]`` tables (:mod:`receiver.config.sinks`), checked together.

:func:`load_settings` reads the file, checks every key (unknown keys, wrong types, out-of-range
values, sink tables) and raises one :class:`~receiver.errors.ConfigError` listing every problem,
each naming its key. This module stands above both: the sections know nothing of the sink
types, and the sink tables build on the sections' :class:`~receiver.config.settings.SinkSettings`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from receiver.config.schema import Section, build_table, did_you_mean
from receiver.config.settings import Settings, schema
from receiver.config.sinks import build_sinks
from receiver.errors import ConfigError


def load_settings(path: str | Path, env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate the config file at ``path``; raise ConfigError naming every bad key."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            f"config file {path} not found (`receiver init` writes one; --config PATH names "
            "another)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    return parse_settings(data, env=env, source=str(path))


def parse_settings(
    data: Mapping[str, Any], *, env: Mapping[str, str] | None = None, source: str = "<memory>"
) -> Settings:
    """Validate an already-parsed TOML document (used by tests and by :func:`load_settings`)."""
    env = os.environ if env is None else env
    problems: list[str] = []
    known = schema()
    names = [s.name for s in known] + ["sinks"]
    for name in data:
        if name not in names:
            problems.append(f"{name}: unknown section{did_you_mean(name, names)}")
    values: dict[str, Any] = {}
    for section in known:
        values[section.name] = _build_section(section, data.get(section.name), env, problems, known)
    sinks = build_sinks(data.get("sinks", []), problems)
    if problems:
        raise ConfigError(problems)
    return Settings(**values, sinks=tuple(sinks), source=source)


def _build_section(
    section: Section, raw: Any, env: Mapping[str, str], problems: list[str], known: list[Section]
) -> Any:
    if not section.many:
        if raw is not None and not isinstance(raw, dict):
            problems.append(f"{section.name}: must be a table")
            raw = None
        return build_table(section, section.name, raw or {}, env, problems, other_sections=known)
    if raw is not None and not isinstance(raw, list):
        problems.append(f"{section.name}: must be an array of tables ([[{section.name}]])")
        raw = None
    tables = []
    for index, table in enumerate(raw or []):
        where = f"{section.name}[{index}]"
        if not isinstance(table, dict):
            problems.append(f"{where}: must be a table")
            continue
        built = build_table(section, where, table, {}, problems, other_sections=known)
        if built is not None:
            tables.append(built)
    return tuple(tables)
