"""``[[sinks]]`` tables: the keys common to every sink and each type's own keys.

Each sink type declares its keys in :mod:`receiver.config.sink_types` (which imports no broker
library); this module checks a config's sink tables against it and makes each a
:class:`~receiver.config.settings.SinkSettings` (:mod:`receiver.config.load` calls it for every
config).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from receiver.config.schema import did_you_mean, typed_values
from receiver.config.settings import SinkSettings
from receiver.config.sink_checks import check_envelope
from receiver.config.sink_types import COMMON_KEYS, SINK_TYPES, Option


def build_sinks(raw: Any, problems: list[str]) -> list[SinkSettings]:
    """The ``[[sinks]]`` tables as settings; every problem goes to ``problems``, by sink name."""
    if not isinstance(raw, list):
        problems.append("sinks: must be an array of tables ([[sinks]])")
        return []
    sinks: list[SinkSettings] = []
    seen: set[str] = set()
    for index, table in enumerate(raw):
        where = f"sinks[{index}]"
        if not isinstance(table, dict):
            problems.append(f"{where}: must be a table")
            continue
        name = table.get("name")
        if isinstance(name, str) and name:
            where = f"sinks.{name}"
            if name in seen:
                problems.append(f"{where}: sink name used twice")
            seen.add(name)
        sink = _build_sink(where, table, problems)
        if sink is not None:
            sinks.append(sink)
    return sinks


def _not_a_key(sink_type: str, key: str, options_spec: Mapping[str, Option]) -> str:
    """Why ``key`` is refused: a key of other sink types says which; else the closest key."""
    owners = [name for name, spec in SINK_TYPES.items() if key in spec.options]
    if owners:
        return f"not a key of {sink_type} sinks (only {', '.join(owners)} sinks take it)"
    return f"not a key of {sink_type} sinks{did_you_mean(key, options_spec)}"


def _build_sink(where: str, table: Mapping[str, Any], problems: list[str]) -> SinkSettings | None:
    sink_type = table.get("type")
    spec = SINK_TYPES.get(sink_type) if isinstance(sink_type, str) else None
    if spec is None:
        if sink_type is None:
            problems.append(f"{where}.type: missing")
        else:
            problems.append(
                f"{where}.type: unknown sink type {sink_type!r}"
                f"{did_you_mean(str(sink_type), SINK_TYPES)} "
                f"(one of {', '.join(sorted(SINK_TYPES))})"
            )
        return None
    options_spec: dict[str, Option] = {**COMMON_KEYS, **spec.options}
    before = len(problems)
    values = typed_values(
        where,
        table,
        {key: (option.kind, option.item_kind) for key, option in options_spec.items()},
        lambda key: _not_a_key(str(sink_type), key, options_spec),
        problems,
    )
    for key, value in list(values.items()):
        choices = options_spec[key].choices
        if choices and value not in choices:
            problems.append(f"{where}.{key}: must be one of {', '.join(choices)}")
            del values[key]
    for key, option in options_spec.items():
        if option.required and key not in table:
            problems.append(f"{where}.{key}: missing")
        elif key not in values and option.default is not None:
            values[key] = option.default
    for key in ("max_attempts", "concurrency"):
        if key in values and values[key] < 1:
            problems.append(f"{where}.{key}: must be at least 1")
    rate = values.setdefault("rate_limit_per_second", spec.default_rate)
    if rate < 0:
        problems.append(f"{where}.rate_limit_per_second: must be 0 (no limit) or more")
    else:
        values["rate_limit_per_second"] = float(rate)
    if values.get("timeout_seconds", 1) <= 0:
        problems.append(f"{where}.timeout_seconds: must be positive")
    if len(problems) > before:
        return None
    if spec.check is not None:
        problems.extend(f"{where}.{problem}" for problem in spec.check(values))
    if "envelope" in spec.options:
        problems.extend(f"{where}.{problem}" for problem in check_envelope(values))
    if len(problems) > before:
        return None
    common = {k: values.pop(k) for k in list(values) if k in COMMON_KEYS}
    return SinkSettings(**common, options=values)
