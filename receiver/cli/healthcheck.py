"""``receiver healthcheck``: ask the running receiver's ops listener whether it is ready.

Made for a container's HEALTHCHECK (and any probe that runs a command): the address comes from
the same config the receiver serves with, so a changed ``admin.port`` or ``admin.host`` needs
no second edit. It prints one line and exits 0 when the receiver answers 200, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
import urllib.error
import urllib.request
from typing import Any

from receiver.cli.common import EXIT_FAILED, settings_from, with_config
from receiver.config.settings import AdminSettings


def add_parser(commands: Any) -> None:
    health = with_config(
        commands.add_parser("healthcheck", help="exit 0 when the running receiver is ready")
    )
    health.add_argument("--live", action="store_true", help="only check that it runs (/healthz)")


def run(args: argparse.Namespace) -> int:
    ok, line = probe(settings_from(args).admin, live=args.live)
    print(line, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else EXIT_FAILED


# An ops listener bound to every address is reached over the loopback of the same family.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}  # noqa: S104


def ops_url(admin: AdminSettings, path: str) -> str:
    """The URL of ``path`` on the ops listener ``admin`` describes, as seen from this host."""
    host = _WILDCARDS.get(admin.host, admin.host)
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:  # a host name
        pass
    return f"http://{host}:{admin.port}{path}"


def probe(admin: AdminSettings, *, live: bool = False, timeout: float = 4.0) -> tuple[bool, str]:
    """GET ``/readyz`` (``/healthz`` with ``live``): (answered 200, one line saying what)."""
    url = ops_url(admin, "/healthz" if live else "/readyz")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (http only)
            return True, f"{url}: {response.status} {_status_word(response.read())}"
    except urllib.error.HTTPError as exc:
        return False, f"{url}: {exc.code} {_reasons(exc.read())}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"{url}: no answer ({getattr(reason, 'strerror', None) or reason})"


def _status_word(body: bytes) -> str:
    try:
        return str(json.loads(body).get("status", "ok"))
    except (ValueError, AttributeError):
        return "ok"


def _reasons(body: bytes) -> str:
    try:
        return "; ".join(json.loads(body).get("reasons") or ()) or "not ready"
    except (ValueError, AttributeError):
        return "not ready"
