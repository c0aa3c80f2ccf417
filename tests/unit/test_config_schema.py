"""The declarative config schema: the example file, loading and suggestions all agree with it."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from receiver.config.load import parse_settings
from receiver.config.schema import (
    Section,
    all_keys,
    at_least,
    build_table,
    key,
    required,
    sections,
)
from receiver.config.settings import Settings, WorkerSettings, schema
from receiver.config.shown import changed_from_defaults
from receiver.config.sink_types import COMMON_KEYS, SINK_TYPES
from receiver.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config.example.toml"
MINIMAL = {"webhook": {"secrets": ["s3cret-value"]}}
# Keys whose value in the example deliberately differs from the default.
EXAMPLE_NOT_DEFAULT = {"webhook.secrets"}

# A table header, live or commented out ("# [[sinks]]"); a key line, live or commented out with
# at most one space after "#" (deeper-indented comment lines are prose, not keys).
_HEADER = re.compile(r"^(?:# ?)?\[(\[)?([a-z_]+)\]")
_KEY = re.compile(r"^(?:# ?)?([a-z_][a-z0-9_]*)\s*=\s*(.*)$")


def documented_keys() -> tuple[set[str], dict[str, set[str]]]:
    """Keys config.example.toml documents: ``section.key`` paths, and each sink type's keys."""
    section_keys: set[str] = set()
    sink_keys: dict[str, set[str]] = {}
    table: str | None = None
    block: set[str] = set()
    sink_type: str | None = None

    def end_sink_block() -> None:
        if table == "sinks" and sink_type is not None:
            sink_keys.setdefault(sink_type, set()).update(block)

    for line in EXAMPLE.read_text().splitlines():
        header = _HEADER.match(line)
        if header:
            end_sink_block()
            table, block, sink_type = header.group(2), set(), None
            continue
        found = _KEY.match(line)
        if not found or table is None:
            continue
        name = found.group(1)
        if table == "sinks":
            block.add(name)
            if name == "type":
                sink_type = tomllib.loads(f"v = {found.group(2).split('#')[0]}")["v"]
        else:
            section_keys.add(f"{table}.{name}")
    end_sink_block()
    return section_keys, sink_keys


def test_the_example_documents_every_key_of_the_schema_and_nothing_else() -> None:
    documented, _ = documented_keys()
    declared = {k.path for k in all_keys(Settings)}
    assert declared - documented == set(), "keys missing from config.example.toml"
    assert documented - declared == set(), "config.example.toml documents unknown keys"


def test_the_example_documents_every_sink_type_and_its_keys() -> None:
    _, documented = documented_keys()
    assert set(documented) == set(SINK_TYPES)
    text = EXAMPLE.read_text()
    for name in COMMON_KEYS:
        assert re.search(rf"^#?\s*{name}\s*=", text, re.M), f"common sink key {name}"
    for sink_type, spec in SINK_TYPES.items():
        keys = documented[sink_type] - set(COMMON_KEYS)
        assert keys == set(spec.options), sink_type


def test_the_example_shows_the_defaults() -> None:
    data = tomllib.loads(EXAMPLE.read_text())
    defaults = Settings()
    loaded = parse_settings(data, env={})
    for k in (k for section in schema() if not section.many for k in section.keys.values()):
        if k.section in data and k.name in data[k.section] and k.path not in EXAMPLE_NOT_DEFAULT:
            assert getattr(getattr(loaded, k.section), k.name) == k.default, k.path
            assert getattr(getattr(defaults, k.section), k.name) == k.default, k.path


def test_every_key_has_help_and_a_loadable_default() -> None:
    for section in schema():
        for k in section.keys.values():
            assert k.help.strip(), f"{k.path} has no help"
            assert section.many or not k.required, f"{k.path}: a [section] key needs a default"
    # The defaults pass their own checks (only webhook.secrets must be set by the user).
    assert parse_settings(MINIMAL, env={}) is not None


def test_a_mistyped_key_or_section_gets_a_suggestion() -> None:
    with pytest.raises(ConfigError) as err:
        parse_settings(
            {
                **MINIMAL,
                "server": {"prot": 8080},
                "worker": {"concurency": 4},
                "admin": {"concurrency": 4},
                "sever": {},
                "sinks": [
                    {"name": "f", "type": "download", "directroy": "x"},
                    {"name": "r", "type": "redsi"},
                ],
            },
            env={},
        )
    problems = err.value.problems
    assert "server.prot: unknown key (did you mean server.port?)" in problems
    assert "worker.concurency: unknown key (did you mean worker.concurrency?)" in problems
    # A key of another section is named where it belongs.
    assert "admin.concurrency: unknown key (did you mean worker.concurrency?)" in problems
    assert "sever: unknown section (did you mean server?)" in problems
    assert "sinks.f.directroy: not a key of download sinks (did you mean directory?)" in problems
    assert any(
        p.startswith("sinks.r.type: unknown sink type 'redsi' (did you mean redis?)")
        for p in problems
    )


def test_an_unrelated_unknown_key_gets_no_guess() -> None:
    with pytest.raises(ConfigError) as err:
        parse_settings({**MINIMAL, "server": {"colour": "red"}}, env={})
    assert err.value.problems == ["server.colour: unknown key"]


def test_environment_variables_are_declared_by_the_schema() -> None:
    envs = {k.env: k.path for k in all_keys(Settings) if k.env}
    assert envs == {
        "RECEIVER_WEBHOOK_SECRETS": "webhook.secrets",
        "RECEIVER_API_KEY": "api.api_key",
        "RECEIVER_ADMIN_TOKEN": "admin.token",
        "RECEIVER_STORE_URL": "store.url",
    }
    s = parse_settings({}, env={"RECEIVER_WEBHOOK_SECRETS": "a,b", "RECEIVER_API_KEY": "k"})
    assert (s.webhook.secrets, s.api.api_key) == (("a", "b"), "k")
    with pytest.raises(ConfigError) as err:
        parse_settings({}, env={"RECEIVER_WEBHOOK_SECRETS": "a", "RECEIVER_STORE_URL": "x://"})
    assert err.value.problems == [
        "store.url: must start with sqlite://, postgresql:// or memory://"
    ]
    del s


def test_cross_key_rules_live_on_the_section() -> None:
    assert WorkerSettings(backoff_initial_seconds=5, backoff_max_seconds=1).problems() == [
        "worker.backoff_max_seconds: must be >= worker.backoff_initial_seconds"
    ]
    assert [s.name for s in schema()] == [
        "server",
        "webhook",
        "api",
        "store",
        "worker",
        "admin",
        "log",
        "pull",
        "tracing",
        "reconcile",
    ]


# --- the mechanisms a new section uses: arrays of tables, required keys, optional keys ---------


@dataclass(frozen=True)
class _Watch:
    collection_id: str = required("the collection to watch")
    interval_minutes: int = key(60, "how often", check=at_least(1))
    label: str | None = key(None, "optional label")
    tags: dict[str, str] | None = key(None, "extra tags")


@dataclass(frozen=True)
class _Tiny:
    worker: WorkerSettings = WorkerSettings()  # noqa: RUF009 - frozen
    watch: tuple[_Watch, ...] = ()


def test_an_array_of_tables_section_is_found_and_checked() -> None:
    found = sections(_Tiny)
    assert [(s.name, s.many) for s in found] == [("worker", False), ("watch", True)]
    watch = found[1]
    problems: list[str] = []
    ok = build_table(watch, "watch[0]", {"collection_id": "c1", "tags": {"a": "b"}}, {}, problems)
    assert ok == _Watch(collection_id="c1", tags={"a": "b"}) and problems == []
    assert build_table(watch, "watch[1]", {"interval_minutes": 0}, {}, problems) is None
    assert problems == ["watch[1].collection_id: missing"]
    problems.clear()
    build_table(watch, "watch[2]", {"collection_id": "c", "interval_minutes": 0}, {}, problems)
    build_table(watch, "watch[3]", {"collection_id": "c", "tags": {"a": 1}}, {}, problems)
    assert problems == [
        "watch[2].interval_minutes: must be at least 1",
        "watch[3].tags: every value must be a string",
    ]


@dataclass(frozen=True)
class _Half:
    a: int = key(1, "declared")
    b: int = 2


@dataclass(frozen=True)
class _WithHalf:
    half: _Half = _Half()


def test_a_half_declared_section_is_an_error_not_ignored() -> None:
    with pytest.raises(TypeError, match="_Half: declare b with key"):
        sections(_WithHalf)
    assert Section("worker", WorkerSettings).keys["concurrency"].help


def test_check_config_lists_what_differs_from_the_defaults_with_secrets_masked() -> None:
    s = parse_settings(
        {
            "server": {"port": 8081, "trusted_proxies": ["10.0.0.1"]},
            "worker": {"backoff_max_seconds": 60},
            "store": {"url": "postgresql://me:pa55word@db/x?password=pa55word"},
            "log": {"format": "json"},
        },
        env={"RECEIVER_WEBHOOK_SECRETS": "whsec_abcdefgh12", "RECEIVER_ADMIN_TOKEN": "t0ken-xyz1"},
    )
    assert changed_from_defaults(s) == [
        "server.port = 8081",
        'server.trusted_proxies = ["10.0.0.1"]',
        "webhook.secrets = [****12 (16 chars)]",
        'store.url = "postgresql://me:****@db/x?****"',
        "worker.backoff_max_seconds = 60",
        "admin.token = ****z1 (10 chars)",
        'log.format = "json"',
    ]
    assert changed_from_defaults(parse_settings({"webhook": {"secrets_file": "s"}}, env={})) == [
        'webhook.secrets_file = "s"'
    ]
