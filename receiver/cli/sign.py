"""``receiver sign``: signed webhook headers for a payload file, or a ready curl command."""

from __future__ import annotations

import argparse
import time
from typing import Any

from receiver.cli.common import EXIT_USAGE, CommandError, read_payload, with_config
from receiver.cli.signing import (
    add_scheme_argument,
    curl_command,
    payload_fields,
    target_signer,
    target_url,
)


def add_parser(commands: Any) -> None:
    sign = with_config(
        commands.add_parser(
            "sign",
            help="print signed webhook headers for a payload file, or a ready curl command",
            description="Sign the exact bytes of FILE as the upstream signs a webhook (or, with "
            "--scheme standard-webhooks, as Standard Webhooks do, the webhook-id being the "
            "payload's id) and print the headers, one `Name: value` line each. Without --secret, "
            "the secret comes from the config (--config, $RECEIVER_CONFIG, then ./config.toml).",
        )
    )
    sign.add_argument("--secret", help="the secret to sign with (default: from the config)")
    sign.add_argument("--timestamp", type=int, help="unix seconds (default: now)")
    add_scheme_argument(sign)
    sign.add_argument(
        "--curl",
        nargs="?",
        const="",
        metavar="URL",
        help="print a curl command POSTing FILE to URL (default: the config's webhook URL)",
    )
    sign.add_argument("file", nargs="?", help="the JSON payload")


def run(args: argparse.Namespace) -> int:
    if args.file is None and args.curl and "://" not in args.curl:
        args.file, args.curl = args.curl, ""  # `sign --curl FILE`: the URL from the config
    if args.file is None:
        raise CommandError("sign needs a payload FILE")
    body = read_payload(args.file)
    timestamp = args.timestamp if args.timestamp is not None else int(time.time())
    event_id, name = payload_fields(body)
    url = target_url(args.curl, args) if args.curl is not None else None
    signer = target_signer(args, "sign")
    if signer is None:
        return EXIT_USAGE
    headers = signer.headers(body, timestamp, event_id=event_id, event_name=name)
    if url is not None:
        print(curl_command(url, headers, args.file))
        return 0
    for header, value in headers.items():
        print(f"{header}: {value}")
    return 0
