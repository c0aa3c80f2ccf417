"""The ``receiver`` command line.

Every mistake a user can make (missing file, bad TOML, unknown key, unreachable store or URL)
ends in one clear line on stderr and a non-zero exit, never a traceback: 2 for a bad config or
command line, 1 for anything that failed while running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from receiver import __version__
from receiver.config import Settings, StoreSettings, config_path, load_settings, masked
from receiver.errors import ConfigError, ReceiverError, UnknownEvent
from receiver.logs import configure_logging
from receiver.replay import event_fields
from receiver.signature import webhook_headers

EXIT_FAILED = 1
EXIT_USAGE = 2


class CommandError(ReceiverError):
    """The command failed."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"receiver: {message} (see receiver --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="receiver", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"receiver {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--config",
            help="config file (default: $RECEIVER_CONFIG, then ./config.toml)",
        )
        return p

    serve = with_config(commands.add_parser("serve", help="run the listeners and the workers"))
    serve.add_argument("--role", choices=("all", "intake", "worker"), default="all")

    with_config(commands.add_parser("check-config", help="validate the config"))
    health = with_config(
        commands.add_parser("healthcheck", help="exit 0 when the running receiver is ready")
    )
    health.add_argument("--live", action="store_true", help="only check that it runs (/healthz)")

    sign = commands.add_parser("sign", help="print signed webhook headers for a payload file")
    sign.add_argument("--secret", required=True)
    sign.add_argument("--timestamp", type=int, help="unix seconds (default: now)")
    sign.add_argument("file")

    replay = with_config(
        commands.add_parser(
            "replay",
            help="sign and POST payload files (or stored events) to a receiver",
            description="Sign each payload with a fresh timestamp and POST it to --url. Payloads "
            "are JSON files or folders of them (PATH...), or events from the inbox of --config "
            "(--from-store EVENT_ID...), e.g. to re-send production events to staging. A terminal "
            "shows a progress bar; otherwise one line per payload is printed. Exit 1 if any was "
            "refused.",
        )
    )
    replay.add_argument("--url", required=True, help="the receiver's webhook URL")
    replay.add_argument("--secret", required=True, help="the secret to sign with")
    replay.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    replay.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    replay.add_argument(
        "--from-store",
        nargs="+",
        metavar="EVENT_ID",
        help="re-send these stored events (their exact bytes) instead of files",
    )
    replay.add_argument("paths", nargs="*", metavar="PATH")

    events = commands.add_parser("events", help="inspect the inbox and redeliver events")
    event_commands = events.add_subparsers(
        dest="events_command", required=True, parser_class=_Parser
    )
    listing = with_config(event_commands.add_parser("list", help="list events, newest first"))
    listing.add_argument("--status", choices=("pending", "done", "dead"))
    listing.add_argument("--limit", type=int, default=50)
    show = with_config(event_commands.add_parser("show", help="one event with its deliveries"))
    show.add_argument("id")
    redeliver = with_config(
        event_commands.add_parser("redeliver", help="process an event (or every dead one) again")
    )
    redeliver.add_argument("id", nargs="?")
    redeliver.add_argument("--dead", action="store_true", help="every dead delivery")

    with_config(
        commands.add_parser("migrate", help="create or upgrade the inbox schema, then exit")
    )

    # --- local testing and the upstream subscription: simulate, webhooks ---
    _add_simulate(commands)
    webhooks = commands.add_parser(
        "webhooks", help="manage the upstream's webhook subscriptions (register, list, delete)"
    )
    webhook_commands = webhooks.add_subparsers(
        dest="webhooks_command", required=True, parser_class=_Parser
    )
    register = with_config(
        webhook_commands.add_parser(
            "register",
            help="subscribe a URL; its secret is appended to webhook.secrets_file",
            description="POST {api.base_url}/webhooks. The secret the upstream shows once is "
            "appended to webhook.secrets_file (created 0600; older secrets stay valid), so "
            "`kill -HUP` the running receiver to accept it. Without webhook.secrets_file this "
            "refuses, unless --show-secret prints the secret for you to store.",
        )
    )
    register.add_argument("--url", required=True, help="the receiver's public webhook URL")
    register.add_argument(
        "--events",
        nargs="+",
        metavar="EVENT",
        help="job.completed and/or job.failed (default: all events)",
    )
    register.add_argument(
        "--show-secret", action="store_true", help="also print the secret (shown once)"
    )
    listing = with_config(
        webhook_commands.add_parser(
            "list", help="id, url, events, active, consecutive_failures of each subscription"
        )
    )
    listing.add_argument("--json", action="store_true", help="print the upstream's objects")
    delete = with_config(webhook_commands.add_parser("delete", help="delete a subscription"))
    delete.add_argument("id")
    return parser


def _add_simulate(commands: Any) -> None:
    """``receiver simulate`` and its flags (the options of receiver.simulator_run)."""
    p = commands.add_parser(
        "simulate",
        help="a local stand-in for the upstream service, sending signed webhooks",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Serve the upstream API (jobs with long-poll, assets, signed file URLs, webhook subscriptions)
and, with --events N, create N jobs of the --kinds given and deliver their webhooks the way the
upstream does: five headers, HMAC signed with each subscription's secret, 10 s per attempt,
retries after 1 min, 5 min, 30 min, 2 h, 6 h, 12 h (times --time-scale), and a subscription
disabled after 100 consecutive failures. Events go to every active subscription: the one
--target/--secret adds, and any created with POST /v1/webhooks (receiver webhooks register).
Sending starts once a subscription exists. A summary is printed at the end; GET
/_simulator/summary shows it live.

examples:
  receiver simulate --target http://127.0.0.1:8080/webhooks \\
      --secret whsec_local_development_secret --events 20 --until-done
  receiver simulate --target http://127.0.0.1:8080/webhooks --secret S --events 200 \\
      --rate 50 --duplicates 0.1 --out-of-order 0.2 --rate-limit 0.1 --retry-after 2 \\
      --derived-delay 5 --time-scale 0.001 --duration 60""",
    )
    server = p.add_argument_group("the API")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=8090, help="default 8090")
    server.add_argument("--api-key", default="", help="Bearer key it requires (default: any)")
    server.add_argument(
        "--examples", default="examples", help="folder of payloads whose jobs it serves"
    )
    events = p.add_argument_group("events and where they go")
    events.add_argument("--target", metavar="URL", help="send webhooks to this URL ...")
    events.add_argument("--secret", help="... signed with this secret")
    events.add_argument("--events", type=int, default=0, metavar="N", help="jobs to create")
    events.add_argument(
        "--kinds",
        default="image,animation,logo,scene,failed",
        help="comma-separated mix, taken in turn (default: image,animation,logo,scene,failed)",
    )
    events.add_argument("--rate", type=float, default=5.0, help="events per second (default 5)")
    events.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    delivery = p.add_argument_group("delivery")
    delivery.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="F",
        help="multiplies the retry waits (0.001: 1 min becomes 60 ms); default 1",
    )
    delivery.add_argument(
        "--attempt-timeout", type=float, default=10.0, help="seconds per attempt (default 10)"
    )
    delivery.add_argument(
        "--concurrency", type=int, default=32, help="attempts in flight (default 32)"
    )
    faults = p.add_argument_group("faults")
    faults.add_argument(
        "--duplicates",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="deliver this fraction of events twice",
    )
    faults.add_argument(
        "--out-of-order",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="hold this fraction back so later events overtake them",
    )
    faults.add_argument(
        "--hold-back",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="longest hold-back of --out-of-order (default 2)",
    )
    faults.add_argument(
        "--clock-skew",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="signer's clock offset (beyond 300 the receiver refuses)",
    )
    faults.add_argument(
        "--derived-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="webm/hevc/stacked_video finish this long after the job",
    )
    faults.add_argument(
        "--pending-for",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="the API shows a job processing this long after its webhook",
    )
    faults.add_argument(
        "--rate-limit",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="this fraction of API calls answers 429",
    )
    faults.add_argument(
        "--retry-after", type=float, metavar="SECONDS", help="Retry-After sent with each 429"
    )
    faults.add_argument(
        "--server-errors",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="this fraction of API calls answers --error-status",
    )
    faults.add_argument("--error-status", type=int, default=500, help="5xx status (default 500)")
    faults.add_argument(
        "--expired-urls",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="this fraction of signed file URLs is issued already expired",
    )
    faults.add_argument(
        "--latency", type=float, default=0.0, metavar="SECONDS", help="added to every API call"
    )
    end = p.add_argument_group("when to stop (default: Ctrl-C / SIGTERM)")
    end.add_argument(
        "--until-done",
        action="store_true",
        help="exit once every delivery has ended; exit 1 unless all got a 2xx",
    )
    end.add_argument(
        "--duration",
        type=float,
        metavar="SECONDS",
        help="exit after this long; exit 1 unless every delivery got a 2xx",
    )
    end.add_argument("--summary-json", metavar="PATH", help="also write the summary as JSON")
    end.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(config_path(args.config))


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    configure_logging(settings.log.level, settings.log.format)
    from receiver.app import serve

    _run(serve(settings, role=args.role))
    return 0


def cmd_healthcheck(args: argparse.Namespace) -> int:
    from receiver.healthcheck import probe

    ok, line = probe(_settings(args).admin, live=args.live)
    print(line, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else EXIT_FAILED


def cmd_check_config(args: argparse.Namespace) -> int:
    settings = _settings(args)
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
        f"{s.worker.backoff_max_seconds:g} s",
        f"  sinks            {len(s.sinks)}",
    ]
    for sink in s.sinks:
        events = ", ".join(sink.events) or "all events"
        job_types = f"; job types {', '.join(sink.job_types)}" if sink.job_types else ""
        lines.append(f"    - {sink.name} ({sink.type}): {events}{job_types}")
    return "\n".join(lines)


def _store_summary(store: StoreSettings) -> str:
    if store.url.startswith(("postgresql://", "postgres://")):
        # Query parameters may carry a password (?password=...): not shown at all.
        url = _mask_url(store.url.split("?", 1)[0])
        return (
            f"{url} (schema {store.schema or '<search_path>'}, pool {store.pool_size}, "
            f"auto_migrate {str(store.auto_migrate).lower()}, "
            f"retention {store.retention_hours:g} h)"
        )
    return (
        f"{_mask_url(store.url)} (synchronous={store.synchronous}, "
        f"retention {store.retention_hours:g} h)"
    )


def _mask_url(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        creds, _, host = rest.rpartition("@")
        user = creds.split(":", 1)[0]
        return f"{scheme}{sep}{user}:****@{host}"
    return url


def _read_payload(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise CommandError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CommandError(f"{path}: is a directory") from None
    except OSError as exc:
        raise CommandError(f"{path}: cannot be read ({exc.strerror})") from None


def cmd_sign(args: argparse.Namespace) -> int:
    body = _read_payload(args.file)
    timestamp = args.timestamp if args.timestamp is not None else int(time.time())
    event_id, name = event_fields(body)
    for header, value in webhook_headers(
        args.secret, body, timestamp, event_id=event_id, event_name=name
    ).items():
        print(f"{header}: {value}")
    return 0


def _payload_files(paths: Sequence[str]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix == ".json" and p.is_file())
            if not found:
                raise CommandError(f"{path}: no .json files in this folder")
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            raise CommandError(f"{path}: no such file or folder")
    return files


def cmd_replay(args: argparse.Namespace) -> int:
    from receiver.replay import Progress, replay, stored_payloads

    if not args.url.startswith(("http://", "https://")):
        raise CommandError(f"--url must be an http(s) URL, not {args.url!r}")
    if args.concurrency < 1:
        raise CommandError("--concurrency must be at least 1")
    if args.from_store and args.paths:
        raise CommandError("give payload files (PATH...) or --from-store EVENT_ID..., not both")
    if args.from_store:
        payloads = _run(stored_payloads(_settings(args), args.from_store))
    elif args.paths:
        payloads = [(str(path), _read_payload(path)) for path in _payload_files(args.paths)]
    else:
        raise CommandError("nothing to send: give PATH... or --from-store EVENT_ID...")
    refused: int = _run(
        replay(
            args.url,
            args.secret,
            payloads,
            concurrency=args.concurrency,
            timeout=args.timeout,
            progress=Progress(len(payloads)),
        )
    )
    return EXIT_FAILED if refused else 0


def cmd_events(args: argparse.Namespace) -> int:
    settings = _settings(args)
    code: int = _run(_events(settings, args))
    return code


async def _events(settings: Settings, args: argparse.Namespace) -> int:
    from receiver.store import open_store

    store = open_store(settings.store)
    await store.open()
    try:
        now = time.time()
        if args.events_command == "list":
            for event in await store.list(state=args.status, limit=args.limit):
                counts: dict[str, int] = {}
                for d in event.deliveries:
                    counts[d.state] = counts.get(d.state, 0) + 1
                summary = " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "no sinks"
                received = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(event.received_at))
                print(f"{event.id}  {event.event:<14} {event.state:<8} {received}  {summary}")
        elif args.events_command == "show":
            record = await store.get(args.id)
            if record is None:
                raise UnknownEvent(f"no event {args.id} in the inbox")
            print(json.dumps(record.as_json(), indent=2))
        elif args.dead:
            if args.id:
                raise CommandError("give an event id or --dead, not both")
            print(f"{await store.redeliver_dead(now=now)} dead deliveries made pending again")
        elif args.id:
            count = await store.redeliver(args.id, now=now)
            print(f"{count} deliveries of {args.id} made pending again")
        else:
            raise CommandError("events redeliver needs an event id or --dead")
    finally:
        await store.close()
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    """Apply the inbox schema migrations (also when store.auto_migrate is false)."""
    settings = _settings(args)
    configure_logging(settings.log.level, settings.log.format)
    from receiver.store.migrate import migrate_store

    print(_run(migrate_store(settings.store)))
    return 0


# --- local testing and the upstream subscription: simulate, webhooks ---


def cmd_simulate(args: argparse.Namespace) -> int:
    from receiver.simulator_delivery import DeliveryFaults
    from receiver.simulator_run import SimulateOptions, all_delivered, run_simulator

    options = SimulateOptions(
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        examples=args.examples,
        target=args.target,
        secret=args.secret,
        events=args.events,
        kinds=tuple(k.strip() for k in args.kinds.split(",") if k.strip()),
        rate=args.rate,
        time_scale=args.time_scale,
        attempt_timeout=args.attempt_timeout,
        concurrency=args.concurrency,
        faults=DeliveryFaults(
            duplicate_fraction=args.duplicates,
            out_of_order_fraction=args.out_of_order,
            hold_back_seconds=args.hold_back,
            clock_skew_seconds=args.clock_skew,
        ),
        derived_delay=args.derived_delay,
        pending_for=args.pending_for,
        rate_limit_fraction=args.rate_limit,
        retry_after=args.retry_after,
        error_fraction=args.server_errors,
        error_status=args.error_status,
        expired_url_fraction=args.expired_urls,
        latency=args.latency,
        until_done=args.until_done,
        duration=args.duration,
        seed=args.seed,
        summary_json=args.summary_json,
    )
    problems = options.problems()
    if problems:
        raise CommandError("; ".join(problems))
    configure_logging(args.log_level, "auto")
    try:
        summary = _run(run_simulator(options))
    except OSError as exc:
        raise CommandError(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
        ) from None
    if (options.until_done or options.duration) and not all_delivered(summary):
        return EXIT_FAILED
    return 0


def cmd_webhooks(args: argparse.Namespace) -> int:
    settings = _settings(args)
    _quiet_logs()  # the outcome is this command's output; no log line may repeat it
    from receiver import subscriptions

    if args.webhooks_command == "register":
        events = [e.strip() for raw in args.events or () for e in raw.split(",") if e.strip()]
        done = _run(
            subscriptions.register(settings, args.url, events or None, show_secret=args.show_secret)
        )
        hook = done.webhook
        names = ", ".join(hook.get("events") or ()) or "all events"
        print(f"registered webhook {hook['id']} for {hook.get('url', args.url)} ({names})")
        if done.secrets_file is not None:
            print(
                f"secret appended to {done.secrets_file} (mode 0600); a running receiver "
                "accepts it after `kill -HUP <pid>`"
            )
            if done.loose_permissions:
                print(
                    f"receiver: warning: {done.secrets_file} is readable by others; "
                    f"chmod 600 {done.secrets_file}",
                    file=sys.stderr,
                )
        if args.show_secret:
            print(f"secret: {done.secret}")
        if done.same_url:
            print(
                f"note: {', '.join(done.same_url)} also deliver(s) to this URL; once the new "
                "secret is loaded, remove the old subscription with `receiver webhooks delete ID`"
            )
    elif args.webhooks_command == "list":
        hooks = _run(subscriptions.list_subscriptions(settings))
        if args.json:
            print(json.dumps(hooks, indent=2))
        else:
            print(format_webhooks(hooks))
    else:
        _run(subscriptions.delete(settings, args.id))
        print(f"deleted webhook {args.id}")
    return 0


def format_webhooks(hooks: Sequence[dict[str, Any]]) -> str:
    """The ``webhooks list`` table."""
    if not hooks:
        return "no webhook subscriptions"
    rows = [("ID", "ACTIVE", "FAILURES", "EVENTS", "URL")]
    for hook in hooks:
        rows.append(
            (
                str(hook.get("id")),
                "yes" if hook.get("active") is not False else "NO",
                str(hook.get("consecutive_failures", "?")),
                ",".join(hook.get("events") or ()) or "all",
                str(hook.get("url")),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True))
        + "  "
        + row[4]
        for row in rows
    )


def _quiet_logs() -> None:
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))


def _run(coro: Any) -> Any:
    """Run a coroutine on uvloop when installed (``receiver[uvloop]``), else asyncio's loop."""
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        uvloop = None
    # Outside the except block, so errors raised while running are not chained to ImportError.
    return asyncio.run(coro) if uvloop is None else uvloop.run(coro)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": cmd_serve,
    "check-config": cmd_check_config,
    "healthcheck": cmd_healthcheck,
    "sign": cmd_sign,
    "replay": cmd_replay,
    "events": cmd_events,
    "migrate": cmd_migrate,
    "simulate": cmd_simulate,
    "webhooks": cmd_webhooks,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"receiver: config: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except ReceiverError as exc:
        print(f"receiver: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        print(f"receiver: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
