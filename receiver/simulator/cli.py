"""The flags of ``receiver simulate``, and the :class:`~receiver.simulator.run.SimulateOptions`
they stand for. The command itself (its checks and exit codes) is :mod:`receiver.cli.simulate`'s.
"""

from __future__ import annotations

import argparse
import secrets
from collections.abc import Mapping
from typing import Any

from receiver.simulator.delivery import DeliveryFaults
from receiver.simulator.handoff import DEFAULT_GRACE_SECONDS
from receiver.simulator.run import SimulateOptions
from receiver.simulator.shape import DEFAULT_SHAPE, SHAPES
from receiver.simulator.versions import KNOWN_API_VERSIONS, SPEC_DRIFTS, VersionFaults

#: The flags ``--config`` can supply (their option names as attributes).
_FROM_CONFIG = ("host", "port", "api_key", "target", "secret")


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``simulate`` and its flags to ``commands`` (an argparse subparsers action)."""
    p: argparse.ArgumentParser = commands.add_parser(
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
    server.add_argument(
        "--config",
        metavar="PATH",
        help="a receiver's config: its webhook URL and newest secret become --target/--secret, "
        "its api.api_key the key required, and the API listens where its api.base_url points",
    )
    server.add_argument("--host", help="default 127.0.0.1")
    server.add_argument("--port", type=int, help="default 8090")
    server.add_argument("--api-key", help="Bearer key it requires (default: any)")
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
    events.add_argument(
        "--seed",
        type=int,
        help="seed of every random choice (default: a random one, printed at the end)",
    )
    events.add_argument(
        "--shape",
        choices=SHAPES,
        default=DEFAULT_SHAPE,
        help="which optional fields objects carry: full (all), minimal (only what the spec "
        f"guarantees) or mixed (varied per object, as the spec allows; default {DEFAULT_SHAPE})",
    )
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
        "--derived-missing",
        action="store_true",
        help="until then they do not exist: GET /v1/assets/{id} answers 404 (not processing)",
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
    faults.add_argument(
        "--no-webhook",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="this fraction of jobs sends no webhook (only polling finds them; each is logged)",
    )
    versions = p.add_argument_group("versions and drift")
    versions.add_argument(
        "--api-versions",
        default=",".join(KNOWN_API_VERSIONS),
        metavar="DATES",
        help="Service-API-Version values accepted, comma-separated; a request without one of "
        "them answers 400 naming the version; 'any' accepts every request (default: the "
        "spec's change history, up to 2026-08-20)",
    )
    versions.add_argument(
        "--spec-drift",
        choices=SPEC_DRIFTS,
        default="none",
        help="what GET /v1/openapi.json serves: none (the revision the receiver was built "
        "against), notice (a newer revision deprecating GET /jobs/{id}) or breaking (also a "
        "job status value added and a job field removed); default none",
    )
    versions.add_argument(
        "--deprecate-jobs",
        action="store_true",
        help="GET /v1/jobs/{id} answers carry Deprecation (RFC 9745) and a Link to its notice",
    )
    versions.add_argument(
        "--sunset-days",
        type=float,
        metavar="DAYS",
        help="GET /v1/jobs/{id} answers carry Sunset (RFC 8594): this many days from the start",
    )
    versions.add_argument(
        "--unknown-status",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="this fraction of jobs reports the status 'queued' (none of the spec's four) for good",
    )
    end = p.add_argument_group("when to stop (default: Ctrl-C / SIGTERM)")
    end.add_argument(
        "--until-done",
        action="store_true",
        help="exit once every delivery has ended and the receiver has fetched the jobs and "
        "assets of the delivered events (see --grace); exit 1 unless all got a 2xx",
    )
    end.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE_SECONDS,
        metavar="SECONDS",
        help="with --until-done: how long to wait for those fetches at most "
        f"(default {DEFAULT_GRACE_SECONDS:g})",
    )
    end.add_argument(
        "--duration",
        type=float,
        metavar="SECONDS",
        help="exit after this long; exit 1 unless every delivery got a 2xx",
    )
    end.add_argument("--summary-json", metavar="PATH", help="also write the summary as JSON")
    end.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="default info",
    )
    return p


def options_from_args(
    args: argparse.Namespace, from_config: Mapping[str, Any] | None = None
) -> SimulateOptions:
    """The :class:`SimulateOptions` the parsed flags of :func:`add_parser` ask for; a flag left
    out takes its value from ``from_config`` (what ``--config`` supplies), else its default."""
    given = dict(from_config or {})
    given.update({k: v for k in _FROM_CONFIG if (v := getattr(args, k)) is not None})
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    return SimulateOptions(
        host=given.get("host", "127.0.0.1"),
        port=given.get("port", 8090),
        api_key=given.get("api_key", ""),
        examples=args.examples,
        target=given.get("target"),
        secret=given.get("secret"),
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
        derived_missing=args.derived_missing,
        pending_for=args.pending_for,
        rate_limit_fraction=args.rate_limit,
        retry_after=args.retry_after,
        error_fraction=args.server_errors,
        error_status=args.error_status,
        expired_url_fraction=args.expired_urls,
        latency=args.latency,
        no_webhook_fraction=args.no_webhook,
        versions=VersionFaults(
            api_versions=None
            if args.api_versions.strip().lower() == "any"
            else tuple(v.strip() for v in args.api_versions.split(",") if v.strip()),
            spec_drift=args.spec_drift,
            deprecate_jobs=args.deprecate_jobs,
            sunset_days=args.sunset_days,
            unknown_status_fraction=args.unknown_status,
        ),
        until_done=args.until_done,
        grace=args.grace,
        duration=args.duration,
        seed=seed,
        shape=args.shape,
        summary_json=args.summary_json,
    )
