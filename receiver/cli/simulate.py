"""``receiver simulate``: the local upstream stand-in (its flags: :mod:`receiver.simulator.cli`)."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import urlsplit

from receiver.cli.common import EXIT_FAILED, CommandError, run_async, settings_from
from receiver.cli.signing import config_secret, webhook_url
from receiver.logs import configure_logging
from receiver.simulator import cli as simulate_flags


def add_parser(commands: Any) -> None:
    simulate_flags.add_parser(commands)


def run(args: argparse.Namespace) -> int:
    from receiver.simulator.run import run_simulator
    from receiver.simulator.summary import all_delivered

    options = simulate_flags.options_from_args(args, _from_config(args))
    problems = options.problems()
    if problems:
        raise CommandError("; ".join(problems))
    configure_logging(args.log_level, "auto")
    try:
        summary = run_async(run_simulator(options))
    except OSError as exc:
        raise CommandError(
            f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc}"
        ) from None
    if (options.until_done or options.duration) and not all_delivered(summary):
        return EXIT_FAILED
    return 0


_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def _from_config(args: argparse.Namespace) -> dict[str, Any]:
    """What ``--config`` supplies: the receiver's webhook URL and secret, its API key, and the
    address its ``api.base_url`` expects the API at (which must be this host)."""
    if args.config is None:
        return {}
    settings = settings_from(args)
    api = urlsplit(settings.api.base_url)
    if api.hostname not in _LOCAL_HOSTS:
        raise CommandError(
            f"api.base_url {settings.api.base_url} of {settings.source} is not on this host: "
            "the simulator cannot stand in for it"
        )
    return {
        "host": api.hostname,
        "port": api.port or (443 if api.scheme == "https" else 80),
        "api_key": settings.api.api_key,
        "target": webhook_url(settings),
        "secret": config_secret(settings),
    }
