"""Configuration: frozen dataclasses loaded from a TOML file and ``RECEIVER_*`` variables.

:func:`load_settings` reads the file, checks every key (unknown keys, wrong types, out-of-range
values, sink tables) and raises one :class:`~receiver.errors.ConfigError` listing every problem,
each naming its key. Secrets may come from the environment instead of the file:
``RECEIVER_WEBHOOK_SECRETS`` (comma-separated), ``RECEIVER_API_KEY``, ``RECEIVER_ADMIN_TOKEN``,
and ``RECEIVER_STORE_URL`` (replaces ``store.url``).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from receiver.errors import ConfigError
from receiver.sinks.registry import COMMON_KEYS, SINK_TYPES, Option

DEFAULT_CONFIG_PATH = "config.toml"
MIN_RETENTION_HOURS = 48


@dataclass(frozen=True)
class ServerSettings:
    host: str = "0.0.0.0"  # noqa: S104 - the public listener is meant to be reachable
    port: int = 8080
    path: str = "/webhooks"
    max_body_bytes: int = 1024 * 1024
    shutdown_timeout_seconds: float = 10.0
    read_timeout_seconds: float = 10.0
    trusted_proxies: tuple[str, ...] = ()


@dataclass(frozen=True)
class WebhookSettings:
    secrets: tuple[str, ...] = ()
    secrets_file: str = ""
    tolerance_seconds: int = 300
    allow_legacy_signature: bool = False


@dataclass(frozen=True)
class ApiSettings:
    base_url: str = "http://127.0.0.1:8090/v1"
    api_key: str = ""
    timeout_seconds: float = 30.0
    watchdog_interval_seconds: float = 300.0


@dataclass(frozen=True)
class StoreSettings:
    url: str = "sqlite:///data/receiver.db"
    retention_hours: float = 168.0
    synchronous: str = "full"
    auto_migrate: bool = True
    pool_size: int = 10
    # Postgres only: the schema holding the inbox tables ("" = the server's search_path), and
    # how long connecting or one statement may take before the store counts as unavailable
    # (short enough for a 503 to reach the upstream within its 10 s webhook timeout).
    schema: str = ""
    timeout_seconds: float = 5.0


@dataclass(frozen=True)
class WorkerSettings:
    concurrency: int = 8
    max_attempts: int = 12
    backoff_initial_seconds: float = 1.0
    backoff_max_seconds: float = 600.0
    lease_seconds: float = 60.0
    poll_interval_seconds: float = 1.0


@dataclass(frozen=True)
class AdminSettings:
    host: str = "127.0.0.1"
    port: int = 9091
    token: str = ""


@dataclass(frozen=True)
class PullSettings:
    """``[pull]``: following jobs that send no webhook (see receiver.pull)."""

    concurrency: int = 20
    wait_seconds: float = 60.0
    watch_expiry_hours: float = 24.0


@dataclass(frozen=True)
class ReconcileSettings:
    """One ``[[reconcile]]`` table: a collection whose assets are delivered when missed."""

    collection_id: str
    interval_minutes: float = 60.0


#: The upstream's long-poll ceiling for GET /jobs/{id}?wait=true.
MAX_WAIT_SECONDS = 120


@dataclass(frozen=True)
class LogSettings:
    level: str = "info"
    format: str = "auto"


@dataclass(frozen=True)
class SinkSettings:
    """One ``[[sinks]]`` table: the keys common to every sink, and the type's own keys."""

    name: str
    type: str
    events: tuple[str, ...] = ()
    job_types: tuple[str, ...] = ()
    max_attempts: int | None = None
    concurrency: int | None = None
    timeout_seconds: float = 60.0
    options: Mapping[str, Any] = field(default_factory=dict)

    def wants_event(self, event_name: str) -> bool:
        return not self.events or event_name in self.events

    def wants_job_type(self, job_type: str | None) -> bool:
        return not self.job_types or job_type in self.job_types


@dataclass(frozen=True)
class Settings:
    server: ServerSettings = ServerSettings()
    webhook: WebhookSettings = WebhookSettings()
    api: ApiSettings = ApiSettings()
    store: StoreSettings = StoreSettings()
    worker: WorkerSettings = WorkerSettings()
    admin: AdminSettings = AdminSettings()
    log: LogSettings = LogSettings()
    pull: PullSettings = PullSettings()
    sinks: tuple[SinkSettings, ...] = ()
    reconcile: tuple[ReconcileSettings, ...] = ()
    source: str = "<defaults>"

    def sink_max_attempts(self, sink: SinkSettings) -> int:
        return sink.max_attempts or self.worker.max_attempts

    def sinks_for_event(self, event_name: str) -> tuple[str, ...]:
        """The names of the sinks whose ``events`` filter takes ``event_name``."""
        return tuple(s.name for s in self.sinks if s.wants_event(event_name))


_SECTIONS: dict[str, type] = {
    "server": ServerSettings,
    "webhook": WebhookSettings,
    "api": ApiSettings,
    "store": StoreSettings,
    "worker": WorkerSettings,
    "admin": AdminSettings,
    "log": LogSettings,
    "pull": PullSettings,
}


def config_path(explicit: str | None, env: Mapping[str, str] | None = None) -> Path:
    """``--config``, else ``$RECEIVER_CONFIG``, else ``./config.toml``."""
    env = os.environ if env is None else env
    return Path(explicit or env.get("RECEIVER_CONFIG") or DEFAULT_CONFIG_PATH)


def load_settings(path: str | Path, env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate the config file at ``path``; raise ConfigError naming every bad key."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found") from None
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
    sections: dict[str, Any] = {}
    for key in data:
        if key not in _SECTIONS and key not in ("sinks", "reconcile"):
            problems.append(f"{key}: unknown section")
    for name, cls in _SECTIONS.items():
        table = data.get(name, {})
        if not isinstance(table, dict):
            problems.append(f"{name}: must be a table")
            table = {}
        sections[name] = _build_section(name, cls, table, problems)

    webhook = sections["webhook"]
    if env.get("RECEIVER_WEBHOOK_SECRETS"):
        secrets = tuple(s.strip() for s in env["RECEIVER_WEBHOOK_SECRETS"].split(",") if s.strip())
        webhook = _replace(webhook, secrets=secrets)
    if env.get("RECEIVER_API_KEY"):
        sections["api"] = _replace(sections["api"], api_key=env["RECEIVER_API_KEY"])
    if env.get("RECEIVER_ADMIN_TOKEN"):
        sections["admin"] = _replace(sections["admin"], token=env["RECEIVER_ADMIN_TOKEN"])
    if env.get("RECEIVER_STORE_URL"):  # a Postgres url carries a password: keep it in a secret
        sections["store"] = _replace(sections["store"], url=env["RECEIVER_STORE_URL"])
    sections["webhook"] = webhook

    _check_values(sections, problems)
    sinks = _build_sinks(data.get("sinks", []), problems)
    reconcile = _build_reconcile(data.get("reconcile", []), problems)
    if problems:
        raise ConfigError(problems)
    return Settings(**sections, sinks=tuple(sinks), reconcile=reconcile, source=source)


def _replace(obj: Any, **changes: Any) -> Any:
    values = {f.name: getattr(obj, f.name) for f in fields(obj)}
    values.update(changes)
    return type(obj)(**values)


def _type_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true or false",
        list: "a list",
        dict: "a table",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _coerce(
    key: str, value: Any, kind: type | tuple[type, ...], item_kind: type | None, problems: list[str]
) -> Any:
    """Check ``value`` against ``kind``; return it (lists as tuples) or None after a problem."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) and bool not in kinds:
        problems.append(f"{key}: must be {_type_name(kind)}, not {value!r}")
        return None
    if not isinstance(value, kinds):
        problems.append(f"{key}: must be {_type_name(kind)}, not {type(value).__name__}")
        return None
    if isinstance(value, list):
        if item_kind is not None and not all(isinstance(v, item_kind) for v in value):
            problems.append(f"{key}: every entry must be {_type_name(item_kind)}")
            return None
        return tuple(value)
    return value


def _build_section(name: str, cls: type, table: Mapping[str, Any], problems: list[str]) -> Any:
    known = {f.name: f for f in fields(cls)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            problems.append(f"{name}.{key}: unknown key")
            continue
        default = known[key].default
        kind: type | tuple[type, ...]
        item_kind: type | None = None
        if isinstance(default, tuple):
            kind, item_kind = list, str
        elif isinstance(default, float):
            kind = (float, int)
        else:
            kind = type(default)
        coerced = _coerce(f"{name}.{key}", value, kind, item_kind, problems)
        if coerced is not None:
            values[key] = coerced
    return cls(**values)


def _check_values(s: dict[str, Any], problems: list[str]) -> None:
    server: ServerSettings = s["server"]
    store: StoreSettings = s["store"]
    worker: WorkerSettings = s["worker"]
    webhook: WebhookSettings = s["webhook"]
    admin: AdminSettings = s["admin"]
    api: ApiSettings = s["api"]
    log: LogSettings = s["log"]
    for key, port in (("server.port", server.port), ("admin.port", admin.port)):
        if not 0 <= port <= 65535:
            problems.append(f"{key}: must be between 0 and 65535")
    if not server.path.startswith("/"):
        problems.append("server.path: must start with /")
    if server.max_body_bytes < 1024:
        problems.append("server.max_body_bytes: must be at least 1024")
    if server.shutdown_timeout_seconds <= 0:
        problems.append("server.shutdown_timeout_seconds: must be positive")
    if store.retention_hours < MIN_RETENTION_HOURS:
        problems.append(
            f"store.retention_hours: must be >= {MIN_RETENTION_HOURS} "
            "(the upstream retries an event for about 21 hours; "
            "a pruned id would be accepted twice)"
        )
    if store.synchronous not in ("full", "normal"):
        problems.append('store.synchronous: must be "full" or "normal"')
    if not store.url.startswith(("sqlite://", "postgresql://", "postgres://", "memory://")):
        problems.append("store.url: must start with sqlite://, postgresql:// or memory://")
    if store.pool_size < 1:
        problems.append("store.pool_size: must be at least 1")
    _check_postgres_store(store, problems)
    if not webhook.secrets and not webhook.secrets_file:
        problems.append(
            "webhook.secrets: no secret configured (set webhook.secrets, webhook.secrets_file "
            "or RECEIVER_WEBHOOK_SECRETS)"
        )
    if any(not secret for secret in webhook.secrets):
        problems.append("webhook.secrets: an entry is empty")
    if webhook.tolerance_seconds <= 0:
        problems.append("webhook.tolerance_seconds: must be positive")
    if not api.base_url.startswith(("http://", "https://")):
        problems.append("api.base_url: must be an http(s) URL")
    if api.timeout_seconds <= 0:
        problems.append("api.timeout_seconds: must be positive")
    if api.watchdog_interval_seconds < 0:
        problems.append("api.watchdog_interval_seconds: must be 0 (off) or more")
    if worker.concurrency < 1:
        problems.append("worker.concurrency: must be at least 1")
    if worker.max_attempts < 1:
        problems.append("worker.max_attempts: must be at least 1")
    if worker.backoff_initial_seconds <= 0:
        problems.append("worker.backoff_initial_seconds: must be positive")
    if worker.backoff_max_seconds < worker.backoff_initial_seconds:
        problems.append("worker.backoff_max_seconds: must be >= worker.backoff_initial_seconds")
    if worker.lease_seconds < 5:
        problems.append("worker.lease_seconds: must be at least 5")
    if worker.poll_interval_seconds <= 0:
        problems.append("worker.poll_interval_seconds: must be positive")
    _check_pull(s["pull"], problems)
    if log.level not in ("debug", "info", "warning", "error"):
        problems.append('log.level: must be "debug", "info", "warning" or "error"')
    if log.format not in ("auto", "json", "console"):
        problems.append('log.format: must be "auto", "json" or "console"')


def _check_pull(pull: PullSettings, problems: list[str]) -> None:
    if pull.concurrency < 1:
        problems.append("pull.concurrency: must be at least 1")
    if not 1 <= pull.wait_seconds <= MAX_WAIT_SECONDS:
        problems.append(
            f"pull.wait_seconds: must be between 1 and {MAX_WAIT_SECONDS} (the upstream's limit)"
        )
    if pull.watch_expiry_hours <= 0:
        problems.append("pull.watch_expiry_hours: must be positive")


def _build_reconcile(raw: Any, problems: list[str]) -> tuple[ReconcileSettings, ...]:
    if not isinstance(raw, list):
        problems.append("reconcile: must be an array of tables ([[reconcile]])")
        return ()
    out: list[ReconcileSettings] = []
    for index, table in enumerate(raw):
        where = f"reconcile[{index}]"
        if not isinstance(table, dict):
            problems.append(f"{where}: must be a table")
            continue
        before = len(problems)
        for key in table:
            if key not in ("collection_id", "interval_minutes"):
                problems.append(f"{where}.{key}: unknown key")
        collection = table.get("collection_id")
        if not isinstance(collection, str) or not _UUID.fullmatch(collection):
            problems.append(f"{where}.collection_id: must be a collection id (a UUID)")
        interval = _coerce(
            f"{where}.interval_minutes",
            table.get("interval_minutes", 60.0),
            (float, int),
            None,
            problems,
        )
        if interval is not None and interval < 1:
            problems.append(f"{where}.interval_minutes: must be at least 1")
        if len(problems) == before:
            out.append(ReconcileSettings(str(collection), float(interval)))
    return tuple(out)


_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def _check_postgres_store(store: StoreSettings, problems: list[str]) -> None:
    """The keys only the Postgres store reads."""
    if store.schema:
        if not store.url.startswith(("postgresql://", "postgres://")):
            problems.append("store.schema: only a postgresql:// store has schemas")
        elif not _SCHEMA_NAME.fullmatch(store.schema):
            problems.append(
                "store.schema: must be a lower-case name of letters, digits and _ "
                "(at most 63, not starting with a digit)"
            )
    if store.timeout_seconds <= 0:
        problems.append("store.timeout_seconds: must be positive")


def _build_sinks(raw: Any, problems: list[str]) -> list[SinkSettings]:
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
        sink_type = table.get("type")
        spec = SINK_TYPES.get(sink_type) if isinstance(sink_type, str) else None
        if spec is None:
            if sink_type is None:
                problems.append(f"{where}.type: missing")
            else:
                problems.append(
                    f"{where}.type: unknown sink type {sink_type!r} "
                    f"(one of {', '.join(sorted(SINK_TYPES))})"
                )
            continue
        options_spec: dict[str, Option] = {**COMMON_KEYS, **spec.options}
        values: dict[str, Any] = {}
        before = len(problems)
        for key, value in table.items():
            option = options_spec.get(key)
            if option is None:
                problems.append(f"{where}.{key}: not a key of {sink_type} sinks")
                continue
            coerced = _coerce(f"{where}.{key}", value, option.kind, option.item_kind, problems)
            if coerced is None:
                continue
            if option.choices and coerced not in option.choices:
                problems.append(f"{where}.{key}: must be one of {', '.join(option.choices)}")
                continue
            values[key] = coerced
        for key, option in options_spec.items():
            if option.required and key not in table:
                problems.append(f"{where}.{key}: missing")
            elif key not in values and option.default is not None:
                values[key] = option.default
        for key in ("max_attempts", "concurrency"):
            if key in values and values[key] < 1:
                problems.append(f"{where}.{key}: must be at least 1")
        if values.get("timeout_seconds", 1) <= 0:
            problems.append(f"{where}.timeout_seconds: must be positive")
        if len(problems) > before:
            continue
        if spec.check is not None:
            problems.extend(f"{where}.{problem}" for problem in spec.check(values))
            if len(problems) > before:
                continue
        common = {k: values.pop(k) for k in list(values) if k in COMMON_KEYS}
        sinks.append(SinkSettings(**common, options=values))
    return sinks


def masked(value: str) -> str:
    """A secret as it may be shown: its length and last two characters at most."""
    if not value:
        return "(unset)"
    if len(value) <= 8:
        return "****"
    return f"****{value[-2:]} ({len(value)} chars)"
