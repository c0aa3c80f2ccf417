"""``receiver sign``: print signed webhook headers for a payload file."""

from __future__ import annotations

import argparse
import time
from typing import Any

from receiver.cli.common import read_payload
from receiver.replay import event_fields
from receiver.signature import webhook_headers


def add_parser(commands: Any) -> None:
    sign = commands.add_parser("sign", help="print signed webhook headers for a payload file")
    sign.add_argument("--secret", required=True)
    sign.add_argument("--timestamp", type=int, help="unix seconds (default: now)")
    sign.add_argument("file")


def run(args: argparse.Namespace) -> int:
    body = read_payload(args.file)
    timestamp = args.timestamp if args.timestamp is not None else int(time.time())
    event_id, name = event_fields(body)
    for header, value in webhook_headers(
        args.secret, body, timestamp, event_id=event_id, event_name=name
    ).items():
        print(f"{header}: {value}")
    return 0
