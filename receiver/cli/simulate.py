"""``receiver simulate``: the local upstream stand-in (its flags: :mod:`receiver.simulator.cli`)."""

from __future__ import annotations

import argparse
from typing import Any

from receiver.cli.common import EXIT_FAILED, CommandError, run_async
from receiver.logs import configure_logging
from receiver.simulator import cli as simulate_flags


def add_parser(commands: Any) -> None:
    simulate_flags.add_parser(commands)


def run(args: argparse.Namespace) -> int:
    from receiver.simulator.run import all_delivered, run_simulator

    options = simulate_flags.options_from_args(args)
    problems = options.problems()
    if problems:
        raise CommandError("; ".join(problems))
    configure_logging(args.log_level, "auto")
    try:
        summary = run_async(run_simulator(options))
    except OSError as exc:
        raise CommandError(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
        ) from None
    if (options.until_done or options.duration) and not all_delivered(summary):
        return EXIT_FAILED
    return 0
