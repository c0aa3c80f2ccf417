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

import aiohttp

from receiver import __version__
from receiver.config import Settings, config_path, load_settings, masked
from receiver.errors import ConfigError, ReceiverError, UnknownEvent
from receiver.logs import configure_logging
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

    sign = commands.add_parser("sign", help="print signed webhook headers for a payload file")
    sign.add_argument("--secret", required=True)
    sign.add_argument("--timestamp", type=int, help="unix seconds (default: now)")
    sign.add_argument("file")

    replay = commands.add_parser("replay", help="sign and POST payload files to a receiver")
    replay.add_argument("--url", required=True)
    replay.add_argument("--secret", required=True)
    replay.add_argument("--concurrency", type=int, default=4)
    replay.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    replay.add_argument("paths", nargs="+", metavar="PATH")

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

    simulate = commands.add_parser("simulate", help="a local stand-in for the upstream service")
    simulate.add_argument("--host", default="127.0.0.1")
    simulate.add_argument("--port", type=int, default=8090)
    simulate.add_argument("--api-key", default="", help="Bearer key it requires (default: any)")
    simulate.add_argument(
        "--examples", default="examples", help="folder of payloads whose jobs it serves"
    )
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(config_path(args.config))


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    configure_logging(settings.log.level, settings.log.format)
    from receiver.app import serve

    _run(serve(settings, role=args.role))
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    settings = _settings(args)
    from receiver.sinks.loader import missing_extras

    problems = missing_extras(settings)
    if problems:
        raise ConfigError(problems)
    print(describe(settings))
    return 0


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
        f"  store            {_mask_url(s.store.url)} (synchronous={s.store.synchronous}, "
        f"retention {s.store.retention_hours:g} h)",
        f"  workers          concurrency {s.worker.concurrency}, max attempts "
        f"{s.worker.max_attempts}, backoff {s.worker.backoff_initial_seconds:g}-"
        f"{s.worker.backoff_max_seconds:g} s",
        f"  sinks            {len(s.sinks)}",
    ]
    for sink in s.sinks:
        events = ", ".join(sink.events) or "all events"
        lines.append(f"    - {sink.name} ({sink.type}): {events}")
    return "\n".join(lines)


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


def _event_fields(body: bytes) -> tuple[str | None, str | None]:
    try:
        data = json.loads(body)
    except ValueError:
        return None, None
    if not isinstance(data, dict):
        return None, None
    event_id, name = data.get("id"), data.get("event")
    return (
        event_id if isinstance(event_id, str) else None,
        name if isinstance(name, str) else None,
    )


def cmd_sign(args: argparse.Namespace) -> int:
    body = _read_payload(args.file)
    timestamp = args.timestamp if args.timestamp is not None else int(time.time())
    event_id, name = _event_fields(body)
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


async def replay(
    url: str,
    secret: str,
    payloads: Sequence[tuple[str, bytes]],
    *,
    concurrency: int = 4,
    timeout: float = 10.0,
    out: Callable[[str], None] = print,
) -> int:
    """POST each payload signed with a fresh timestamp; returns how many were refused."""
    refused = 0
    slots = asyncio.Semaphore(max(1, concurrency))

    async def send(session: aiohttp.ClientSession, path: str, body: bytes) -> None:
        nonlocal refused
        event_id, name = _event_fields(body)
        headers = webhook_headers(
            secret, body, int(time.time()), event_id=event_id, event_name=name
        )
        async with slots:
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    text = await response.text()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                refused += 1
                out(f"ERR  {path}  {type(exc).__name__}: {exc or 'timed out'}")
                return
        ok = 200 <= status < 300
        if not ok:
            refused += 1
        detail = event_id or "-"
        if not ok:
            try:
                detail += "  " + json.loads(text)["error"]["code"]
            except (ValueError, KeyError, TypeError):
                detail += "  " + text[:80]
        elif '"duplicate":true' in text.replace(" ", ""):
            detail += "  (duplicate)"
        out(f"{status}  {path}  {detail}")

    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(timeout=client_timeout) as session:
        await asyncio.gather(*(send(session, path, body) for path, body in payloads))
    out(f"{len(payloads)} sent, {len(payloads) - refused} accepted, {refused} refused")
    return refused


def cmd_replay(args: argparse.Namespace) -> int:
    if not args.url.startswith(("http://", "https://")):
        raise CommandError(f"--url must be an http(s) URL, not {args.url!r}")
    payloads = [(str(path), _read_payload(path)) for path in _payload_files(args.paths)]
    refused: int = _run(
        replay(args.url, args.secret, payloads, concurrency=args.concurrency, timeout=args.timeout)
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


def cmd_simulate(args: argparse.Namespace) -> int:
    configure_logging("info", "auto")
    from receiver.simulator import run_simulator

    _run(
        run_simulator(host=args.host, port=args.port, api_key=args.api_key, examples=args.examples)
    )
    return 0


def _run(coro: Any) -> Any:
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": cmd_serve,
    "check-config": cmd_check_config,
    "sign": cmd_sign,
    "replay": cmd_replay,
    "events": cmd_events,
    "simulate": cmd_simulate,
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
