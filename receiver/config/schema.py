"""The config schema: every key declared once, on the dataclass field that holds its value.

A section is a frozen dataclass in :mod:`receiver.config.settings` whose fields are declared with
:func:`key`; the field's annotation is the key's type::

    port: int = key(8080, "port of the public listener", check=between(0, 65535))

**Adding a key is that one line** (and a line documenting it in ``config.example.toml``, which a
test holds to the schema). Loading (type, default, check, ``env`` override), ``check-config``
(did-you-mean for a mistyped key, the values that differ from the defaults), the config that
``receiver init`` writes and the example-file test all read it from there.

For example, a new ``[worker]`` key is one field of ``WorkerSettings`` and one line under
``[worker]`` in ``config.example.toml``::

    job_max_age_seconds: float = key(300.0, "how long a fetched job is reused", check=positive)

- A new ``[section]``: a dataclass of :func:`key` fields, plus a field of that type in
  :class:`receiver.config.settings.Settings` (``pull: PullSettings = PullSettings()``).
- A new array of tables (``[[name]]``): a dataclass of :func:`key` fields (a key without a
  default is required, see :func:`required`), plus a field
  ``name: tuple[Cls, ...] = ()`` of ``Settings``.
- Rules across keys (one key only makes sense with another): a ``problems(self) -> list[str]``
  method on the section's dataclass, returning whole ``"section.key: ..."`` lines.

Types: ``str``, ``int``, ``float`` (an integer is accepted), ``bool``, ``tuple[str, ...]``
(a TOML list of strings), ``dict[str, str]`` (a TOML table of strings), each optionally
``| None`` (default None: unset). ``[[sinks]]`` tables are the exception: each sink type declares
its keys in :mod:`receiver.config.sink_types`.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# A check returns the problem with a valid-typed value ("must be positive"), or None.
Check = Callable[[Any], str | None]

_META = "receiver.config.schema"


@dataclass(frozen=True)
class Key:
    """One config key as the schema declares it."""

    section: str
    name: str
    type: Any  # the field's annotation, resolved
    default: Any  # dataclasses.MISSING when required
    help: str
    check: Check | None = None
    env: str | None = None  # an environment variable that replaces the file's value
    secret: bool = False  # never shown: masked in summaries

    @property
    def path(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING


def key(
    default: Any,
    help: str,
    *,
    check: Check | None = None,
    env: str | None = None,
    secret: bool = False,
) -> Any:
    """Declare a key with its default, one line of help, an optional check and env variable."""
    meta = {_META: (help, check, env, secret)}
    return dataclasses.field(default=default, metadata=meta)


def required(help: str, *, check: Check | None = None) -> Any:
    """Declare a key every table must set (for arrays of tables such as ``[[reconcile]]``)."""
    return dataclasses.field(metadata={_META: (help, check, None, False)})


# --- checks ------------------------------------------------------------------------------------


def rule(predicate: Callable[[Any], bool], problem: str) -> Check:
    """A check from a predicate and the problem stated when it is false."""
    return lambda value: None if predicate(value) else problem


def at_least(minimum: float) -> Check:
    return rule(lambda v: v >= minimum, f"must be at least {minimum:g}")


def between(low: float, high: float) -> Check:
    return rule(lambda v: low <= v <= high, f"must be between {low:g} and {high:g}")


def one_of(*choices: str) -> Check:
    quoted = [f'"{c}"' for c in choices]
    text = ", ".join(quoted[:-1]) + f" or {quoted[-1]}" if len(quoted) > 1 else quoted[0]
    return rule(lambda v: v in choices, f"must be {text}")


positive: Check = rule(lambda v: v > 0, "must be positive")


# --- reading the schema ------------------------------------------------------------------------


@dataclass(frozen=True)
class Section:
    """A ``[name]`` table (``many=False``) or a ``[[name]]`` array of tables of ``cls``."""

    name: str
    cls: type
    many: bool = False

    @property
    def keys(self) -> dict[str, Key]:
        return section_keys(self.name, self.cls)


def is_section(cls: Any) -> bool:
    """A dataclass whose every field is declared with :func:`key` or :func:`required`.

    A dataclass with some undeclared fields is a mistake, not a section: TypeError names them.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return False
    found = dataclasses.fields(cls)
    undeclared = [f.name for f in found if _META not in f.metadata]
    if undeclared and len(undeclared) < len(found):
        raise TypeError(f"{cls.__name__}: declare {', '.join(undeclared)} with key()")
    return not undeclared


def section_keys(name: str, cls: type) -> dict[str, Key]:
    hints = typing.get_type_hints(cls)
    result: dict[str, Key] = {}
    for f in dataclasses.fields(cls):
        help_text, check, env, secret = f.metadata[_META]
        result[f.name] = Key(name, f.name, hints[f.name], f.default, help_text, check, env, secret)
    return result


def sections(settings_cls: type) -> list[Section]:
    """The sections of a settings class, in declaration order (see the module docstring).

    A field whose dataclass declares no key with :func:`key` (``sinks``) is not a section.
    """
    hints = typing.get_type_hints(settings_cls)
    found: list[Section] = []
    for f in dataclasses.fields(settings_cls):
        kind = hints[f.name]
        if is_section(kind):
            found.append(Section(f.name, kind))
        elif typing.get_origin(kind) is tuple:
            args = typing.get_args(kind)
            if len(args) == 2 and args[1] is Ellipsis and is_section(args[0]):
                found.append(Section(f.name, args[0], many=True))
    return found


def all_keys(settings_cls: type) -> list[Key]:
    return [k for section in sections(settings_cls) for k in section.keys.values()]


# --- loading -----------------------------------------------------------------------------------


def _base_type(kind: Any) -> tuple[Any, bool]:
    """``(type, optional)`` of an annotation such as ``int | None``."""
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        return args[0], True
    return kind, False


_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    list: "a list",
    dict: "a table",
}


def type_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)


def coerce(
    where: str,
    value: Any,
    kind: type | tuple[type, ...],
    item_kind: type | None,
    problems: list[str],
) -> Any:
    """Check ``value`` against ``kind``; return it (lists as tuples) or None after a problem."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) and bool not in kinds:
        problems.append(f"{where}: must be {type_name(kind)}, not {value!r}")
        return None
    if not isinstance(value, kinds):
        problems.append(f"{where}: must be {type_name(kind)}, not {type(value).__name__}")
        return None
    if isinstance(value, list):
        if item_kind is not None and not all(isinstance(v, item_kind) for v in value):
            problems.append(f"{where}: every entry must be {type_name(item_kind)}")
            return None
        return tuple(value)
    if (
        isinstance(value, dict)
        and item_kind is not None
        and not all(isinstance(v, item_kind) for v in value.values())
    ):
        problems.append(f"{where}: every value must be {type_name(item_kind)}")
        return None
    return value


Kind = tuple[type | tuple[type, ...], type | None]


def typed_values(
    where: str,
    table: Mapping[str, Any],
    kinds: Mapping[str, Kind],
    unknown: Callable[[str], str],
    problems: list[str],
) -> dict[str, Any]:
    """The keys of ``table`` that ``kinds`` knows, each checked against its type; an unknown key
    is reported with ``unknown(key)``, a wrong type by :func:`coerce`."""
    values: dict[str, Any] = {}
    for name, value in table.items():
        if name not in kinds:
            problems.append(f"{where}.{name}: {unknown(name)}")
            continue
        kind, item_kind = kinds[name]
        coerced = coerce(f"{where}.{name}", value, kind, item_kind, problems)
        if coerced is not None:
            values[name] = coerced
    return values


def toml_kind(k: Key) -> Kind:
    """The TOML type a key takes and, for lists and tables, the type of their entries."""
    kind, _optional = _base_type(k.type)
    origin = typing.get_origin(kind)
    if origin is tuple:
        return list, typing.get_args(kind)[0]
    if origin is dict:
        return dict, typing.get_args(kind)[1]
    if kind is float:
        return (float, int), None
    return kind, None


def from_env(k: Key, raw: str) -> Any:
    """An environment variable's text as the key's value (a list: comma-separated)."""
    kind, _ = toml_kind(k)
    if kind is list:
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    return raw


def build_table(
    section: Section,
    where: str,
    table: Mapping[str, Any],
    env: Mapping[str, str],
    problems: list[str],
    *,
    other_sections: Sequence[Section] = (),
) -> Any:
    """One table of ``section`` as its dataclass, or None when a required key is missing.

    Reports unknown keys (with a suggestion), wrong types, failed checks and the section's own
    ``problems()``, each naming ``where.key``.
    """
    keys = section.keys
    values = typed_values(
        where,
        table,
        {name: toml_kind(k) for name, k in keys.items()},
        lambda name: f"unknown key{_suggest_key(name, section, other_sections)}",
        problems,
    )
    for k in keys.values():
        if k.env and env.get(k.env):
            values[k.name] = from_env(k, env[k.env])
    missing = [k for k in keys.values() if k.required and k.name not in values]
    for k in missing:
        if k.name not in table:
            problems.append(f"{where}.{k.name}: missing")
    if missing:
        return None
    for name, value in values.items():
        check = keys[name].check
        problem = check(value) if check is not None and value is not None else None
        if problem:
            problems.append(f"{where}.{name}: {problem}")
    built = section.cls(**values)
    own_rules = getattr(built, "problems", None)
    if callable(own_rules):
        problems.extend(own_rules())
    return built


def _suggest_key(name: str, section: Section, others: Sequence[Section]) -> str:
    """`` (did you mean worker.concurrency?)`` for a key that is close or in another section."""
    close = suggest(name, section.keys)
    if close:
        return f" (did you mean {section.name}.{close}?)"
    elsewhere = [s.name for s in others if s.name != section.name and name in s.keys]
    if elsewhere:
        return f" (did you mean {elsewhere[0]}.{name}?)"
    return ""


def suggest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to a mistyped ``word``, if one is close enough."""
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean X?)`` or ``""``: the tail of a message about a mistyped name."""
    close = suggest(word, candidates)
    return f" (did you mean {close}?)" if close else ""
