"""``receiver replay``: sign and POST payload files (or stored events) to a receiver."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from receiver.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    CommandError,
    read_payload,
    run_async,
    settings_from,
    with_config,
)
from receiver.cli.signing import add_scheme_argument, target_signer, target_url


def add_parser(commands: Any) -> None:
    replay = with_config(
        commands.add_parser(
            "replay",
            help="sign and POST payload files (or stored events) to a receiver",
            description="Sign each payload with a fresh timestamp and POST it to --url. Payloads "
            "are JSON files or folders of them (PATH...), signed with a secret of --config and "
            "sent to its listener unless --url/--secret say otherwise; or events from the inbox "
            "of --config "
            "(--from-store EVENT_ID...), e.g. to re-send production events to staging. A terminal "
            "shows a progress bar; otherwise one line per payload is printed. Exit 1 if any was "
            "refused.",
        )
    )
    replay.add_argument(
        "--url", help="the receiver's webhook URL (default: the config's public listener)"
    )
    replay.add_argument("--secret", help="the secret to sign with (default: from the config)")
    add_scheme_argument(replay)
    replay.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    replay.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    replay.add_argument(
        "--from-store",
        nargs="+",
        metavar="EVENT_ID",
        help="re-send these stored events (their exact bytes) instead of files",
    )
    replay.add_argument(
        "paths", nargs="*", metavar="PATH", help="JSON payload files, or folders of them"
    )


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


def run(args: argparse.Namespace) -> int:
    from receiver.cli.replayer import Progress, replay, stored_payloads

    if args.concurrency < 1:
        raise CommandError("--concurrency must be at least 1")
    if args.from_store and args.paths:
        raise CommandError("give payload files (PATH...) or --from-store EVENT_ID..., not both")
    if args.from_store and not (args.url and args.secret):
        # The config is the source inbox here, so it cannot also say where to send.
        raise CommandError("--from-store needs --url and --secret of the receiving side")
    url, signer = target_url(args.url, args), target_signer(args, "replay")
    if signer is None:
        return EXIT_USAGE
    if args.from_store:
        payloads = run_async(stored_payloads(settings_from(args), args.from_store))
    elif args.paths:
        payloads = [(str(path), read_payload(path)) for path in _payload_files(args.paths)]
    else:
        raise CommandError("nothing to send: give PATH... or --from-store EVENT_ID...")
    refused: int = run_async(
        replay(
            url,
            signer,
            payloads,
            concurrency=args.concurrency,
            timeout=args.timeout,
            progress=Progress(len(payloads)),
        )
    )
    return EXIT_FAILED if refused else 0
