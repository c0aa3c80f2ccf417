"""How the soak writes its figures: "n/a" for what was not measured, MiB, dead / live rows."""

from __future__ import annotations

from collections import Counter
from typing import Any

MIB = 1024 * 1024


def na(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / MIB:,.2f} MiB"


def bloat(dead: int | None, live: int | None) -> str:
    """Dead rows over live ones (Postgres)."""
    if dead is None or live is None:
        return "n/a"
    return f"{dead / live:.2f}" if live else ("0" if not dead else "inf")


def counts(counter: Counter[Any]) -> str:
    """`` (503 x2, ...)`` for a non-empty counter, else nothing."""
    if not counter:
        return ""
    return " (" + ", ".join(f"{k} x{v}" for k, v in counter.most_common()) + ")"
