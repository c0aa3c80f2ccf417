"""``receiver check-config``: validate the config and print a summary with secrets masked."""

from __future__ import annotations

import argparse
from typing import Any

from receiver.cli.common import settings_from, with_config
from receiver.config.settings import Settings, SinkSettings, StoreSettings
from receiver.config.shown import changed_from_defaults, masked, masked_url
from receiver.errors import ConfigError


def add_parser(commands: Any) -> None:
    with_config(commands.add_parser("check-config", help="validate the config"))


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    from receiver.sinks.loader import missing_extras

    problems = missing_extras(settings)
    problems.extend(_store_problems(settings))
    if problems:
        raise ConfigError(problems)
    print(describe(settings))
    return 0


def _store_problems(settings: Settings) -> list[str]:
    """What building (not opening) the store finds: a missing extra, a bad SQLite url."""
    from receiver.store import open_store

    try:
        open_store(settings.store)
    except ConfigError as exc:
        return exc.problems
    return []


def describe(settings: Settings) -> str:
    """A summary of the settings with every secret masked."""
    s = settings
    lines = [
        f"config {s.source}: OK",
        f"  public listener  http://{s.server.host}:{s.server.port}{s.server.path} "
        f"(max body {s.server.max_body_bytes} bytes)",
        f"  ops listener     http://{s.admin.host}:{s.admin.port} "
        f"(admin token {masked(s.admin.token)})",
        f"  webhook secrets  {len(s.webhook.secrets)} configured"
        + (f", plus file {s.webhook.secrets_file}" if s.webhook.secrets_file else "")
        + f"; tolerance {s.webhook.tolerance_seconds} s"
        + ("; legacy signature accepted" if s.webhook.allow_legacy_signature else ""),
        f"  upstream API     {s.api.base_url} (API key {masked(s.api.api_key)})",
        f"  store            {_store_summary(s.store)}",
        f"  workers          concurrency {s.worker.concurrency}, max attempts "
        f"{s.worker.max_attempts}, backoff {s.worker.backoff_initial_seconds:g}-"
        f"{s.worker.backoff_max_seconds:g} s, job max age {s.worker.job_max_age_seconds:g} s",
        f"  pull mode        {s.pull.concurrency} long-polls of {s.pull.wait_seconds:g} s, "
        f"watches expire after {s.pull.watch_expiry_hours:g} h; "
        + (
            ", ".join(
                f"reconcile {r.collection_id} every {r.interval_minutes:g} min" for r in s.reconcile
            )
            or "no collection reconciled"
        ),
        f"  sinks            {len(s.sinks)} (one lane each)",
    ]
    for sink in s.sinks:
        events = ", ".join(sink.events) or "all events"
        job_types = f"; job types {', '.join(sink.job_types)}" if sink.job_types else ""
        lines.append(f"    - {sink.name} ({sink.type}): {events}{job_types}")
        lines.append(f"      lane: {lane_summary(s, sink)}; sends {format_summary(sink)}")
    changed = changed_from_defaults(s)
    lines.append(f"  not defaults     {len(changed)}")
    lines.extend(f"    {line}" for line in changed)
    return "\n".join(lines)


def lane_summary(settings: Settings, sink: SinkSettings) -> str:
    """A sink's lane: sends in flight and pace."""
    rate = sink.rate_limit_per_second
    pace = f"rate {rate:g}/s" if rate > 0 else "rate unlimited"
    return f"concurrency {settings.sink_concurrency(sink)}, {pace}"


def format_summary(sink: SinkSettings) -> str:
    """What a sink sends: its envelope and, for a signed HTTP forward, the signature scheme."""
    from receiver.outbound.envelopes import Envelope
    from receiver.signature import SERVICE_SCHEME

    envelope = Envelope(sink.options)
    shown = f"{envelope.kind} ({envelope.mode} mode)" if envelope.cloudevents else envelope.kind
    if sink.type == "http":
        shown += f", signed {sink.options.get('signing') or SERVICE_SCHEME}"
    return shown


def _store_summary(store: StoreSettings) -> str:
    if store.url.startswith(("postgresql://", "postgres://")):
        # Query parameters may carry a password (?password=...): not shown at all.
        url = masked_url(store.url.split("?", 1)[0])
        return (
            f"{url} (schema {store.schema or '<search_path>'}, pool {store.pool_size}, "
            f"auto_migrate {str(store.auto_migrate).lower()}, "
            f"retention {store.retention_hours:g} h)"
        )
    return (
        f"{masked_url(store.url)} (synchronous={store.synchronous}, "
        f"retention {store.retention_hours:g} h)"
    )
