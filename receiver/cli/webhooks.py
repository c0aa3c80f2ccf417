"""``receiver webhooks``: register, list and delete the upstream's webhook subscriptions."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from receiver.cli.common import Parser, quiet_logs, run_async, settings_from, with_config


def add_parser(commands: Any) -> None:
    webhooks = commands.add_parser(
        "webhooks", help="manage the upstream's webhook subscriptions (register, list, delete)"
    )
    webhook_commands = webhooks.add_subparsers(
        dest="webhooks_command", required=True, parser_class=Parser
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
    delete.add_argument("id", help="the subscription's id (see webhooks list)")


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    quiet_logs()  # the outcome is this command's output; no log line may repeat it
    from receiver.upstream import subscriptions

    if args.webhooks_command == "register":
        events = [e.strip() for raw in args.events or () for e in raw.split(",") if e.strip()]
        done = run_async(
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
        hooks = run_async(subscriptions.list_subscriptions(settings))
        if args.json:
            print(json.dumps(hooks, indent=2))
        else:
            print(format_webhooks(hooks))
    else:
        run_async(subscriptions.delete(settings, args.id))
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
