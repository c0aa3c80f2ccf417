"""Times as people read and type them: UTC ISO 8601, "3 min ago", and ``--since 2h``."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")


def iso_utc(ts: float) -> str:
    """``2026-11-23T09:41:07Z``: seconds precision, always UTC."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def ago(ts: float, now: float) -> str:
    """How long before ``now`` ``ts`` was, in the largest whole unit: ``3 min ago``."""
    seconds = now - ts
    if seconds < 0:
        return "in the future"
    if seconds < 45:
        return "just now" if seconds < 1 else f"{int(seconds)} s ago"
    minutes = seconds / 60
    if minutes < 60:
        return f"{max(1, round(minutes))} min ago"
    hours = minutes / 60
    if hours < 36:
        return f"{round(hours)} h ago"
    return f"{round(hours / 24)} days ago"


def parse_duration(text: str) -> float:
    """Seconds from ``90s``, ``5m``, ``2h``, ``1d``, ``1w`` or ``1h30m``; ValueError otherwise."""
    compact = text.replace(" ", "").lower()
    pos, total = 0, 0.0
    for match in _DURATION.finditer(compact):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if not compact or pos != len(compact):
        raise ValueError(f"not a duration: {text!r} (e.g. 90s, 5m, 2h, 1d)")
    return total


def parse_since(text: str, now: float) -> float:
    """The epoch time ``--since`` means: a duration back from ``now`` (``2h``), or an ISO 8601
    date or time (``2026-11-23``, ``2026-11-23T09:00``, UTC unless it names an offset)."""
    return parse_when(text, now, what="--since")


def parse_when(text: str, now: float, *, what: str = "WHEN") -> float:
    """The epoch time a ``WHEN`` means (see :func:`parse_since`); ``what`` names it in the
    error (``--until``, ``since``)."""
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        named = f"{what} {text!r}" if what else repr(text)
        raise ValueError(
            f"{named}: give a duration (90s, 5m, 2h, 1d) or a UTC time (2026-11-23T09:00)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
