"""``receiver upstream check``: has the upstream changed anything the receiver reads?

Reads ``{api.base_url}/openapi.json`` once, compares it with the revision this release was built
against, and prints each difference that matters with its severity (a table, or ``--json``).
Exit 0 when nothing that matters changed (notices only), 1 when something breaking did, 2 when
the upstream's document cannot be read (one line on stderr saying why).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from receiver.cli.common import Parser, quiet_logs, run_async, settings_from, with_config

if TYPE_CHECKING:  # imported when the command runs: `receiver --help` stays quick
    from receiver.config.settings import Settings
    from receiver.upstream.drift import DriftReport

_WIDTH = 64


def add_parser(commands: Any) -> None:
    upstream = commands.add_parser(
        "upstream", help="compare the upstream's API with the one this release was built for"
    )
    upstream_commands = upstream.add_subparsers(
        dest="upstream_command", required=True, parser_class=Parser
    )
    check = with_config(
        upstream_commands.add_parser(
            "check",
            help="read the upstream's /openapi.json and print what changed that the receiver reads",
            description="GET {api.base_url}/openapi.json, compared with the revision this "
            "release was built against, for the operations the receiver calls and the fields it "
            "reads. Exit 0: nothing that matters changed; 1: something breaking did; 2: the "
            "document cannot be read.",
        )
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    quiet_logs()  # the report is this command's output
    report: DriftReport = run_async(_check(settings))
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    elif report.error is None:
        print(render(report))
    if report.error is not None:
        print(f"receiver upstream check: {report.error}", file=sys.stderr)
    return report.exit_code


async def _check(settings: Settings) -> DriftReport:
    import aiohttp

    from receiver.upstream.spec_check import check_upstream

    async with aiohttp.ClientSession() as session:
        return await check_upstream(session, settings.api)


def render(report: DriftReport) -> str:
    """The report as text: what was read, then one line a finding."""
    checked = datetime.fromtimestamp(report.checked_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    lines = [
        f"upstream revision {report.revision or '(not read)'}, built against "
        f"{report.baseline}, api.version {report.api_version}, checked {checked}"
    ]
    if not report.findings:
        lines.append("nothing the receiver reads changed")
        return "\n".join(lines)
    width = min(_WIDTH, max(len(f.where) for f in report.findings))
    lines.append(f"{'SEVERITY':<9} {'WHERE':<{width}} CHANGE")
    order = {"breaking": 0, "notice": 1}
    for f in sorted(report.findings, key=lambda f: order[f.severity]):
        lines.append(f"{f.severity:<9} {f.where:<{width}} {f.change}")
    counts = report.counts()
    lines.append(f"{counts['breaking']} breaking, {counts['notice']} notice(s)")
    return "\n".join(lines)
