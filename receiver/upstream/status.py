"""What one receiver process knows of its upstream right now, read without changing anything.

:class:`UpstreamSide` names what the inbox page reads of a running process (the runtime): its
API client (the pinned version, and whether the upstream refuses it), the subscription
watchdog, the OpenAPI document check and its latest report. :func:`announcements` lists the
endpoints whose answers announce a ``Deprecation`` or a ``Sunset``
(:mod:`receiver.upstream.deprecation`), their links without query strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from receiver.logs import redact_url
from receiver.upstream.client import UpstreamClient
from receiver.upstream.deprecation import DeprecationWatch
from receiver.upstream.drift import DriftReport
from receiver.upstream.spec_check import SpecCheck
from receiver.upstream.watchdog import Watchdog


class UpstreamSide(Protocol):
    """The upstream as one process sees it: each part None where the process has none."""

    @property
    def upstream(self) -> UpstreamClient | None:
        """The API client (None before the process is open)."""

    @property
    def watchdog(self) -> Watchdog | None:
        """The subscription watchdog (None in a process that does not watch)."""

    @property
    def spec_check(self) -> SpecCheck | None:
        """The OpenAPI document check (None in a process that does not read the document)."""

    @property
    def upstream_drift(self) -> DriftReport | None:
        """The check's latest report (None before its first look ends)."""


@dataclass(frozen=True)
class Announcement:
    """One endpoint's latest retirement notice: whether it is deprecated and since when (unix
    seconds, None when no date was given), its sunset date, and its links as ``(rel, URL)``."""

    endpoint: str
    deprecated: bool
    deprecated_at: float | None
    sunset_at: float | None
    links: tuple[tuple[str, str], ...]


def announcements(watch: DeprecationWatch) -> list[Announcement]:
    """Every endpoint announcing a deprecation or a sunset now, by endpoint; the links' query
    strings and credentials left out."""
    return [
        Announcement(
            endpoint=endpoint,
            deprecated=notice.deprecated,
            deprecated_at=notice.deprecated_at,
            sunset_at=notice.sunset_at,
            links=tuple((rel, redact_url(url)) for rel, url in notice.links),
        )
        for endpoint, notice in sorted(watch.notices.items())
    ]
