"""Configuration: frozen dataclasses loaded from a TOML file and ``RECEIVER_*`` variables.

Every key is declared once, in the section dataclasses below, with its type, default, check and
one line of help (see :mod:`receiver.config.schema` for how to add a key or a section).
:func:`~receiver.config.load.load_settings` reads the file and checks every key, the ``[[sinks]]``
tables too (:mod:`receiver.config.sinks`, against each sink type's keys); this module, below
both, imports neither. Secrets may come from the environment instead of the file:
``RECEIVER_WEBHOOK_SECRETS`` (comma-separated), ``RECEIVER_API_KEY``, ``RECEIVER_ADMIN_TOKEN``,
and ``RECEIVER_STORE_URL`` (replaces ``store.url``).
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from receiver.config.schema import (
    Section,
    at_least,
    between,
    key,
    one_of,
    positive,
    required,
    rule,
    sections,
)
from receiver.extras import install_hint

DEFAULT_CONFIG_PATH = "config.toml"
MIN_RETENTION_HOURS = 48
MAX_PROCESSES = 64
_PORT = between(0, 65535)


@dataclass(frozen=True)
class ServerSettings:
    """The public listener."""

    host: str = key("0.0.0.0", "address of the public listener")  # noqa: S104 - meant to be reachable
    port: int = key(8080, "port of the public listener", check=_PORT)
    path: str = key(
        "/webhooks",
        "the webhook path",
        check=rule(lambda v: v.startswith("/"), "must start with /"),
    )
    max_body_bytes: int = key(
        1024 * 1024, "larger bodies are refused with 413", check=at_least(1024)
    )
    shutdown_timeout_seconds: float = key(
        10.0, "on SIGTERM: time to answer, drain and release claims", check=positive
    )
    read_timeout_seconds: float = key(10.0, "headers and body must arrive within this time")
    trusted_proxies: tuple[str, ...] = key((), "addresses whose X-Forwarded-For is believed")
    processes: int = key(
        1,
        "intake processes sharing the public port (SO_REUSEPORT); the first runs the workers",
        check=between(1, MAX_PROCESSES),
    )


@dataclass(frozen=True)
class WebhookSettings:
    """Verifying the upstream's signatures."""

    secrets: tuple[str, ...] = key(
        (),
        "signing secrets; any match verifies",
        check=rule(lambda v: all(v), "an entry is empty"),
        env="RECEIVER_WEBHOOK_SECRETS",
        secret=True,
    )
    secrets_file: str = key("", "a file of secrets, one a line, re-read on SIGHUP")
    tolerance_seconds: int = key(300, "allowed signature timestamp skew", check=positive)
    allow_legacy_signature: bool = key(False, "accept X-Service-Signature (not replay-safe)")

    def problems(self) -> list[str]:
        if not self.secrets and not self.secrets_file:
            return [
                "webhook.secrets: no secret configured (set webhook.secrets, "
                "webhook.secrets_file or RECEIVER_WEBHOOK_SECRETS)"
            ]
        return []


def _is_date(value: str) -> bool:
    """A real calendar date written ``YYYY-MM-DD``."""
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value) is None:
        return False
    try:
        date.fromisoformat(value)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class ApiSettings:
    """The upstream service's API."""

    base_url: str = key(
        "http://127.0.0.1:8090/v1",
        "the upstream's base URL, ending in /v1",
        check=rule(lambda v: v.startswith(("http://", "https://")), "must be an http(s) URL"),
    )
    api_key: str = key("", "Bearer key for the upstream API", env="RECEIVER_API_KEY", secret=True)
    timeout_seconds: float = key(30.0, "per upstream request", check=positive)
    version: str = key(
        "2026-08-20",
        "the API version pinned: sent as Service-API-Version on every upstream request",
        check=rule(_is_date, "must be a date written YYYY-MM-DD"),
    )
    spec_check_minutes: float = key(
        60.0,
        "how often the upstream's /openapi.json is compared with what the receiver reads; "
        "0 = only at start",
        check=rule(lambda v: v >= 0, "must be 0 (only at start) or more"),
    )
    watchdog_interval_seconds: float = key(
        300.0,
        "how often the webhook subscriptions are checked; 0 = off",
        check=rule(lambda v: v >= 0, "must be 0 (off) or more"),
    )


_STORE_SCHEMES = ("sqlite://", "postgresql://", "postgres://", "memory://")
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


@dataclass(frozen=True)
class StoreSettings:
    """The inbox: where events wait, deduplicated, until every sink has them."""

    url: str = key(
        "sqlite:///data/receiver.db",
        "sqlite:///relative.db, sqlite:////absolute.db or postgresql://...",
        check=rule(
            lambda v: v.startswith(_STORE_SCHEMES),
            "must start with sqlite://, postgresql:// or memory://",
        ),
        env="RECEIVER_STORE_URL",  # a Postgres url carries a password: keep it in a secret
    )
    retention_hours: float = key(
        168.0,
        f"processed events are kept this long; at least {MIN_RETENTION_HOURS}",
        check=rule(
            lambda v: v >= MIN_RETENTION_HOURS,
            f"must be >= {MIN_RETENTION_HOURS} (the upstream retries an event for about 21 "
            "hours; a pruned id would be accepted twice)",
        ),
    )
    ledger_retention_days: float = key(
        30.0,
        "the job-outcome and asset ledgers (each outcome and asset delivered once) remember "
        "this long, and never less than retention_hours; reconcile skips assets created before",
        check=rule(
            lambda v: v >= MIN_RETENTION_HOURS / 24, f"must be >= {MIN_RETENTION_HOURS // 24}"
        ),
    )
    synchronous: str = key("full", "SQLite: full or normal", check=one_of("full", "normal"))
    auto_migrate: bool = key(True, "create/upgrade the inbox schema at start")
    pool_size: int = key(10, "Postgres: connections per process", check=at_least(1))
    # Postgres only: the schema holding the inbox tables ("" = the server's search_path), and
    # how long connecting or one statement may take before the store counts as unavailable
    # (short enough for a 503 to reach the upstream within its 10 s webhook timeout).
    schema: str = key("", "Postgres: schema of the inbox tables; empty = search_path")
    timeout_seconds: float = key(
        5.0, "Postgres: limit for connecting or one statement", check=positive
    )

    def problems(self) -> list[str]:
        if not self.schema:
            return []
        if not self.url.startswith(("postgresql://", "postgres://")):
            return ["store.schema: only a postgresql:// store has schemas"]
        if not _SCHEMA_NAME.fullmatch(self.schema):
            return [
                "store.schema: must be a lower-case name of letters, digits and _ "
                "(at most 63, not starting with a digit)"
            ]
        return []


@dataclass(frozen=True)
class WorkerSettings:
    """Processing the inbox: fetching jobs and delivering to sinks."""

    concurrency: int = key(8, "events processed at once", check=at_least(1))
    max_attempts: int = key(12, "attempts per delivery, then dead", check=at_least(1))
    backoff_initial_seconds: float = key(1.0, "first retry delay, doubling", check=positive)
    backoff_max_seconds: float = key(600.0, "longest retry delay")
    lease_seconds: float = key(
        60.0, "a crashed worker's claims return after this", check=at_least(5)
    )
    poll_interval_seconds: float = key(
        1.0, "how often idle workers look for due retries", check=positive
    )
    job_max_age_seconds: float = key(
        300.0,
        "a stored job snapshot is reused by later deliveries while younger than this",
        check=rule(lambda v: v >= 0, "must be 0 (always fetch again) or more"),
    )
    circuit_failures: int = key(
        5,
        "consecutive failed attempts that pause a sink's lane (0 = never)",
        check=rule(lambda v: v >= 0, "must be 0 (no circuit breaker) or more"),
    )
    circuit_pause_seconds: float = key(
        30.0, "the first pause of a lane whose circuit opened, doubling", check=positive
    )

    def problems(self) -> list[str]:
        if self.backoff_max_seconds < self.backoff_initial_seconds:
            return ["worker.backoff_max_seconds: must be >= worker.backoff_initial_seconds"]
        return []


@dataclass(frozen=True)
class AdminSettings:
    """The ops listener: /metrics, /healthz, /readyz, /admin/..."""

    host: str = key("127.0.0.1", "address of the ops listener; keep it private")
    port: int = key(9091, "port of the ops listener", check=_PORT)
    token: str = key("", "Bearer token /admin/* requires", env="RECEIVER_ADMIN_TOKEN", secret=True)


#: The upstream's long-poll ceiling for GET /jobs/{id}?wait=true.
MAX_WAIT_SECONDS = 120


@dataclass(frozen=True)
class PullSettings:
    """``[pull]``: following jobs that send no webhook (see receiver.pull)."""

    concurrency: int = key(20, "long-polls in flight", check=at_least(1))
    wait_seconds: float = key(
        60.0,
        "the timeout of GET /jobs/{id}?wait=true",
        check=rule(
            lambda v: 1 <= v <= MAX_WAIT_SECONDS,
            f"must be between 1 and {MAX_WAIT_SECONDS} (the upstream's limit)",
        ),
    )
    watch_expiry_hours: float = key(
        24.0, "a watched job not finished by then ends as expired", check=positive
    )


_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


@dataclass(frozen=True)
class ReconcileSettings:
    """One ``[[reconcile]]`` table: a collection whose assets are delivered when missed."""

    collection_id: str = required(
        "the collection whose completed assets no sink got are delivered",
        check=rule(lambda v: bool(_UUID.fullmatch(v)), "must be a collection id (a UUID)"),
    )
    interval_minutes: float = key(60.0, "how often the collection is reconciled", check=at_least(1))


@dataclass(frozen=True)
class LogSettings:
    """Logging to stderr."""

    level: str = key(
        "info", "debug, info, warning or error", check=one_of("debug", "info", "warning", "error")
    )
    format: str = key("auto", "auto, json or console", check=one_of("auto", "json", "console"))


def otel_installed() -> bool:
    """Whether the OpenTelemetry SDK and its OTLP/HTTP exporter can be imported (nothing of
    them is imported to tell)."""
    try:
        return all(
            importlib.util.find_spec(name) is not None
            for name in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
        )
    except ImportError:
        return False


@dataclass(frozen=True)
class TracingSettings:
    """``[tracing]``: OpenTelemetry traces over OTLP/HTTP (the ``receiver[otel]`` extra)."""

    enabled: bool = key(False, "export one trace per event (needs the receiver[otel] extra)")
    endpoint: str = key(
        "",
        "OTLP/HTTP base URL, spans go to {endpoint}/v1/traces; empty: the OTEL_EXPORTER_OTLP_"
        "(TRACES_)ENDPOINT variables, else no export",
        check=rule(
            lambda v: not v or v.startswith(("http://", "https://")),
            "must be an http:// or https:// URL (or empty)",
        ),
    )
    service_name: str = key(
        "receiver",
        "service.name of the spans (OTEL_SERVICE_NAME wins when set)",
        check=rule(bool, "must not be empty"),
    )
    sample_ratio: float = key(
        1.0,
        "share of the traces this receiver starts that are kept; an incoming sampled "
        "traceparent is always kept",
        check=between(0, 1),
    )

    def problems(self) -> list[str]:
        if self.enabled and not otel_installed():
            return [
                "tracing.enabled: OpenTelemetry is not installed, it comes with the extra "
                f"receiver[otel]; {install_hint('otel')}"
            ]
        return []


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
    rate_limit_per_second: float = 0.0
    options: Mapping[str, Any] = field(default_factory=dict)

    def wants_event(self, event_name: str) -> bool:
        return not self.events or event_name in self.events

    def wants_job_type(self, job_type: str | None) -> bool:
        return not self.job_types or job_type in self.job_types


@dataclass(frozen=True)
class Settings:
    """The whole configuration: one field per section (see :mod:`receiver.config.schema`)."""

    server: ServerSettings = ServerSettings()
    webhook: WebhookSettings = WebhookSettings()
    api: ApiSettings = ApiSettings()
    store: StoreSettings = StoreSettings()
    worker: WorkerSettings = WorkerSettings()
    admin: AdminSettings = AdminSettings()
    log: LogSettings = LogSettings()
    pull: PullSettings = PullSettings()
    tracing: TracingSettings = TracingSettings()
    sinks: tuple[SinkSettings, ...] = ()
    reconcile: tuple[ReconcileSettings, ...] = ()
    source: str = "<defaults>"

    def sink_max_attempts(self, sink: SinkSettings) -> int:
        return sink.max_attempts or self.worker.max_attempts

    def sinks_for_event(self, event_name: str) -> tuple[str, ...]:
        """The names of the sinks whose ``events`` filter takes ``event_name``."""
        return tuple(s.name for s in self.sinks if s.wants_event(event_name))

    def sink_concurrency(self, sink: SinkSettings) -> int:
        """Sends in flight in the sink's lane (per process)."""
        return sink.concurrency or self.worker.concurrency


def schema() -> list[Section]:
    """Every ``[section]`` and ``[[array]]`` of the config, in order (not ``[[sinks]]``)."""
    return sections(Settings)


def config_path(explicit: str | None, env: Mapping[str, str] | None = None) -> Path:
    """``--config``, else ``$RECEIVER_CONFIG``, else ``./config.toml``."""
    env = os.environ if env is None else env
    return Path(explicit or env.get("RECEIVER_CONFIG") or DEFAULT_CONFIG_PATH)
