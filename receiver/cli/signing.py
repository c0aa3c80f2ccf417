"""What ``receiver sign`` and ``receiver replay`` share: what they take from the config when the
command line leaves it out (the receiver's webhook URL and a secret it accepts), the signing
scheme (``--scheme``), and the ready-to-run curl command ``sign --curl`` prints."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Mapping

from receiver.cli.common import CommandError, settings_from
from receiver.config.settings import Settings, config_path
from receiver.secrets import SecretBox
from receiver.signature import SCHEMES, SERVICE_SCHEME, Signer


def webhook_url(settings: Settings) -> str:
    """The public listener's webhook URL as a client on this host reaches it."""
    server = settings.server
    host = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}.get(  # noqa: S104
        server.host, server.host
    )
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{server.port}{server.path}"


def config_secret(settings: Settings) -> str:
    """The newest secret the receiver accepts (``webhook.secrets`` then ``secrets_file``)."""
    return SecretBox(settings.webhook).secrets[-1]


def curl_command(url: str, headers: Mapping[str, str], file: str) -> str:
    """A curl command POSTing ``file``'s exact bytes with ``headers``; it prints the answer and
    its status, and exits non-zero on a 4xx or 5xx."""
    lines = [f"curl -sS --fail-with-body -X POST {shlex.quote(url)}"]
    lines += [f"  -H {shlex.quote(f'{name}: {value}')}" for name, value in headers.items()]
    lines.append(f"  --data-binary @{shlex.quote(file)} -w ' %{{http_code}}\\n'")
    return " \\\n".join(lines)


def _from_config(args: argparse.Namespace, what: str) -> Settings:
    """The config (``--config``, ``$RECEIVER_CONFIG``, ``./config.toml``) supplying ``what``."""
    path = config_path(args.config)
    if not path.exists():
        raise CommandError(f"no {what} given and no config at {path} to take it from")
    return settings_from(args)


def target_secret(args: argparse.Namespace) -> str:
    """``--secret``, else the config's newest secret."""
    secret: str = args.secret or config_secret(_from_config(args, "--secret"))
    return secret


def target_url(given: str | None, args: argparse.Namespace) -> str:
    """``given``, else the config's webhook URL; http(s) only."""
    url = given or webhook_url(_from_config(args, "URL"))
    if not url.startswith(("http://", "https://")):
        raise CommandError(f"the URL must be http(s), not {url!r}")
    return url


def add_scheme_argument(parser: argparse.ArgumentParser) -> None:
    """``--scheme service|standard-webhooks``."""
    parser.add_argument(
        "--scheme",
        choices=SCHEMES,
        default=SERVICE_SCHEME,
        help="service (Service-Signature, as the upstream signs; default) or standard-webhooks "
        "(webhook-id, webhook-timestamp, webhook-signature; the secret in whsec_<base64> form), "
        "e.g. to try a consumer of the http sink",
    )


def target_signer(args: argparse.Namespace, command: str) -> Signer | None:
    """The signer of ``--scheme`` with :func:`target_secret`; None, after one stderr line, when
    the secret does not suit the scheme (a usage error)."""
    secret = target_secret(args)
    try:
        return Signer(args.scheme, secret)
    except ValueError as exc:
        given = "--secret" if args.secret else "the config's secret"
        print(f"receiver: {command}: {given} {exc}", file=sys.stderr)
        return None


def payload_fields(body: bytes) -> tuple[str | None, str | None]:
    """The ``id`` and ``event`` of a payload, when it is a JSON object that has them."""
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
