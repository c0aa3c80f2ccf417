"""The upstream's notices that an endpoint is being retired: ``Deprecation`` and ``Sunset``.

An answer may carry

- ``Deprecation`` (RFC 9745): ``@<unix seconds>``, when the endpoint is (or will be)
  deprecated; older drafts of that RFC sent ``true`` (deprecated, no date) or an HTTP date;
- ``Sunset`` (RFC 8594): the HTTP date after which the endpoint may stop answering;
- ``Link`` with ``rel="deprecation"`` (a page explaining it) or ``rel="sunset"``.

:class:`DeprecationWatch` counts each answer carrying either header in
``receiver_upstream_deprecated_total{endpoint}``, keeps the sunset date in
``receiver_upstream_sunset_timestamp_seconds{endpoint}``, and logs a warning the first time an
endpoint announces something (again only when the announcement changes), naming the endpoint,
both dates and the links. A successful answer carrying neither header withdraws the sunset
date. A header that cannot be read is ignored, with one debug line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from receiver.logs import get_logger
from receiver.observe.metrics import Metrics

log = get_logger("receiver.upstream")

_UNIX_DATE = re.compile(r"@(-?\d{1,15})")
# One link of a Link header: <target> followed by its parameters, up to the next link.
_LINK = re.compile(r"<([^>]*)>((?:\s*;\s*[^;,]*)*)")
_REL = re.compile(r""";\s*rel\s*=\s*(?:"([^"]*)"|([^\s;,"]+))""", re.IGNORECASE)
_WANTED_RELS = ("deprecation", "sunset")
#: Different notices logged per endpoint at most (an upstream that changes its dates on every
#: answer is still counted and exported, not logged each time).
_MAX_LOGGED_NOTICES = 8


class Unreadable(ValueError):
    """A header value that is not in the form its RFC gives."""


@dataclass(frozen=True)
class Notice:
    """What one answer says about its endpoint's retirement."""

    deprecated: bool = False
    deprecated_at: float | None = None  # unix seconds; None: no date given
    sunset_at: float | None = None
    links: tuple[tuple[str, str], ...] = ()  # (rel, URL), sorted

    def __bool__(self) -> bool:
        return self.deprecated or self.sunset_at is not None

    def link(self, rel: str) -> str | None:
        """The ``rel`` link's target (``deprecation`` or ``sunset``), if the answer gave one."""
        return dict(self.links).get(rel)


def parse_deprecation(value: str) -> tuple[bool, float | None]:
    """``(deprecated, when)`` from a ``Deprecation`` value; :class:`Unreadable` otherwise."""
    text = value.strip()
    if match := _UNIX_DATE.fullmatch(text):
        return True, float(match.group(1))
    if text.lower() == "true":  # the drafts before RFC 9745
        return True, None
    return True, parse_http_date(text)


def parse_http_date(value: str) -> float:
    """Unix seconds of an HTTP date (``Sun, 06 Nov 1994 08:49:37 GMT``); Unreadable otherwise."""
    try:
        when = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError, OverflowError) as exc:
        raise Unreadable(value) from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def parse_links(values: list[str]) -> dict[str, str]:
    """The ``deprecation`` and ``sunset`` link targets of ``Link`` header values."""
    links: dict[str, str] = {}
    for value in values:
        for match in _LINK.finditer(value):
            target, params = match.group(1).strip(), match.group(2)
            for rel_match in _REL.finditer(params):
                for rel in (rel_match.group(1) or rel_match.group(2) or "").lower().split():
                    if rel in _WANTED_RELS:
                        links.setdefault(rel, target)
    return links


def read_notice(
    endpoint: str, deprecation: str | None, sunset: str | None, links: list[str]
) -> Notice:
    """The :class:`Notice` of one answer's headers; an unreadable header counts as absent."""
    deprecated, deprecated_at, sunset_at = False, None, None
    if deprecation is not None:
        try:
            deprecated, deprecated_at = parse_deprecation(deprecation)
        except Unreadable:
            log.debug("unreadable Deprecation header ignored", endpoint=endpoint, value=deprecation)
    if sunset is not None:
        try:
            sunset_at = parse_http_date(sunset)
        except Unreadable:
            log.debug("unreadable Sunset header ignored", endpoint=endpoint, value=sunset)
    if not (deprecated or sunset_at is not None):
        return Notice()
    return Notice(deprecated, deprecated_at, sunset_at, tuple(sorted(parse_links(links).items())))


class DeprecationWatch:
    """Counts, exports and logs what the upstream's answers say about retiring endpoints."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self._metrics = metrics
        #: The latest notice of each endpoint that announced one.
        self.notices: dict[str, Notice] = {}
        self._logged: dict[str, set[Notice]] = {}

    def observe(
        self,
        endpoint: str,
        status: int,
        deprecation: str | None,
        sunset: str | None,
        links: list[str],
    ) -> Notice:
        """Take in one answer of ``endpoint`` (its status and headers); its notice."""
        notice = read_notice(endpoint, deprecation, sunset, links)
        previous = self.notices.get(endpoint)
        if not notice:
            if 200 <= status < 300 and previous is not None:
                del self.notices[endpoint]  # the upstream no longer announces it
                self._sunset(endpoint, previous, None)
            return notice
        self.notices[endpoint] = notice
        if self._metrics is not None:
            self._metrics.upstream_deprecated.labels(endpoint).inc()
        self._sunset(endpoint, previous, notice.sunset_at)
        logged = self._logged.setdefault(endpoint, set())
        if notice not in logged and len(logged) < _MAX_LOGGED_NOTICES:
            logged.add(notice)
            log.warning(
                "the upstream announces that an endpoint the receiver uses is deprecated"
                if notice.deprecated
                else "the upstream announces a sunset date for an endpoint the receiver uses",
                endpoint=endpoint,
                deprecated_at=_iso(notice.deprecated_at),
                sunset_at=_iso(notice.sunset_at),
                deprecation_link=notice.link("deprecation"),
                sunset_link=notice.link("sunset"),
            )
        return notice

    def _sunset(self, endpoint: str, previous: Notice | None, sunset_at: float | None) -> None:
        """The endpoint's sunset gauge set to ``sunset_at``, or dropped when there is none."""
        if self._metrics is None:
            return
        if sunset_at is not None:
            self._metrics.upstream_sunset.labels(endpoint).set(sunset_at)
        elif previous is not None and previous.sunset_at is not None:
            self._metrics.upstream_sunset.remove(endpoint)


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, UTC).isoformat()
    except (OverflowError, OSError, ValueError):
        return None
