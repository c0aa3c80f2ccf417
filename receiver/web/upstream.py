"""The overview's two upstream sections, read from the process's :class:`UpstreamSide`.

- "Upstream subscriptions": the webhook subscriptions as the watchdog last listed them;
- "Upstream API": the revision of the upstream's OpenAPI document last read (or why it could
  not be read) and when, the pinned ``api.version`` (and the upstream's reason when it refuses
  it), each difference that matters with its severity, and the endpoints announcing a
  ``Deprecation`` or ``Sunset``.

URLs are shown without their query strings; the page escapes every value.
"""

from __future__ import annotations

from typing import Any

from receiver.logs import redact_url
from receiver.upstream.status import UpstreamSide, announcements

_ORDER = {"breaking": 0, "notice": 1}


def subscriptions_section(side: UpstreamSide | None) -> dict[str, Any]:
    """The subscription watchdog's latest look, as the overview shows it."""
    watchdog = side.watchdog if side is not None else None
    if watchdog is None:
        return {"watched": False}
    hooks = [
        {
            "id": str(hook.get("id")),
            "url": redact_url(str(hook.get("url", ""))),
            "active": hook.get("active") is not False,
            "failures": hook.get("consecutive_failures") or 0,
            "events": ", ".join(str(e) for e in hook.get("events") or []),
        }
        for hook in watchdog.subscriptions or []
    ]
    return {
        "watched": True,
        "hooks": hooks,
        "checked_at": watchdog.checked_at,
        "error": watchdog.last_error,
    }


def api_section(side: UpstreamSide | None) -> dict[str, Any]:
    """The upstream's API as this process last saw it: ``reads`` (whether this process reads
    the OpenAPI document), ``report`` (the latest look, None before the first ends),
    ``findings`` (breaking first), ``pinned`` and ``refused`` (the pinned version and why the
    upstream refuses it, None while it does not), ``announcements``."""
    client = side.upstream if side is not None else None
    report = side.upstream_drift if side is not None else None
    findings = sorted(report.findings, key=lambda f: _ORDER[f.severity]) if report else []
    return {
        "reads": side is not None and side.spec_check is not None,
        "report": report,
        "findings": findings,
        "pinned": client.pin.version if client is not None else None,
        "refused": client.pin.refused if client is not None else None,
        "announcements": announcements(client.deprecations) if client is not None else [],
    }
