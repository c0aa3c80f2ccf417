"""The overview's "Upstream API" section, drawn from a process's state without a browser: the
revision or why it could not be read, the pinned version and its refusal, each finding, the
endpoints being retired; every value escaped, no URL's query string shown."""

from __future__ import annotations

from dataclasses import dataclass
from html.parser import HTMLParser
from types import SimpleNamespace
from typing import Any

from receiver.upstream.deprecation import DeprecationWatch
from receiver.upstream.drift import DriftReport, Finding
from receiver.upstream.pin import VersionPin
from receiver.upstream.status import announcements
from receiver.web.render import ENVIRONMENT, View
from receiver.web.upstream import api_section

NOW = 1_790_000_000.0
SUNSET = "Tue, 01 Dec 2026 00:00:00 GMT"
BLOCKS = {"h2", "h3", "dl", "div", "dt", "dd", "p", "br", "table", "tr", "th", "td"}


@dataclass
class Side:
    """A process's upstream state, as the runtime offers it."""

    upstream: Any = None
    watchdog: Any = None
    spec_check: Any = None
    upstream_drift: DriftReport | None = None


def client(version: str = "2026-08-20") -> Any:
    return SimpleNamespace(pin=VersionPin(version), deprecations=DeprecationWatch())


def report(**kw: Any) -> DriftReport:
    values: dict[str, Any] = {
        "revision": "1.14.0",
        "api_version": "2026-08-20",
        "checked_at": NOW - 30,
        "baseline": "1.14.0",
    }
    return DriftReport(**(values | kw))


class Section(HTMLParser):
    """The text of ``#upstream-api`` (what a person reads), and its raw HTML."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.depth = 0
        self.parts: list[str] = []
        start = html.index('<section class="panel" id="upstream-api">')
        self.html = html[start : html.index("</section>", start)]
        self.feed(self.html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in BLOCKS:
            self.parts.append(" ")

    def handle_data(self, data: str) -> None:
        self.parts.append(data)

    @property
    def text(self) -> str:
        return " ".join("".join(self.parts).split())


def section(side: Side | None) -> Section:
    html = ENVIRONMENT.get_template("overview.html").render(
        view=View(now=NOW),
        now=NOW,
        section="overview",
        title="Overview",
        counts={"pending": 0, "done": 0, "dead": 0},
        oldest_pending=None,
        lanes=[],
        errors=[],
        upstream={"watched": False},
        upstream_api=api_section(side),
        pause_choices=(),
    )
    return Section(html)


def test_a_matching_document_shows_its_revision_the_pin_and_no_difference():
    shown = section(Side(upstream=client(), spec_check=object(), upstream_drift=report()))
    assert "Revision 1.14.0 (this release was built against 1.14.0)" in shown.text
    assert "Last read 30 s ago" in shown.text
    assert "Pinned version 2026-08-20 (api.version)" in shown.text
    assert "No difference that matters" in shown.text
    assert "refused" not in shown.text


def test_findings_breaking_first_each_with_its_badge_and_escaped():
    findings = [
        Finding("notice", "GET /jobs/{id}", "marked deprecated"),
        Finding("breaking", "job.status (GET /jobs/{id})", "new value '<script>x</script>'"),
    ]
    drift = report(revision="1.16.0", findings=findings)
    shown = section(Side(upstream=client(), spec_check=object(), upstream_drift=drift))
    assert "Revision 1.16.0 (this release was built against 1.14.0)" in shown.text
    assert shown.text.index("breaking job.status") < shown.text.index("notice GET /jobs/{id}")
    assert '<span class="badge breaking">breaking</span>' in shown.html
    assert "new value &#39;&lt;script&gt;x&lt;/script&gt;&#39;" in shown.html
    assert "<script>" not in shown.html
    assert "No difference that matters" not in shown.text


def test_a_document_never_read_says_why_and_when_it_was_tried():
    drift = report(
        revision=None,
        error="http://sim.example/v1/openapi.json could not be reached: refused",
    )
    shown = section(Side(upstream=client(), spec_check=object(), upstream_drift=drift))
    assert "Revision not read Last tried 30 s ago" in shown.text
    assert "could not be read: http://sim.example/v1/openapi.json could not be reached" in (
        shown.text
    )
    assert "No difference that matters" not in shown.text


def test_a_failed_read_keeps_the_last_documents_findings():
    drift = report(
        revision="1.16.0",
        error="http://sim.example/v1/openapi.json answered 503",
        findings=[Finding("breaking", "job.item_name (GET /jobs/{id})", "gone")],
    )
    shown = section(Side(upstream=client(), spec_check=object(), upstream_drift=drift))
    assert "answered 503. Below: what the last document read (revision 1.16.0) changed." in (
        shown.text
    )
    assert "breaking job.item_name (GET /jobs/{id}) gone" in shown.text


def test_before_the_first_look_and_in_a_process_that_does_not_read():
    waiting = section(Side(upstream=client(), spec_check=object()))
    assert "Revision not read yet" in waiting.text
    assert "Last read" not in waiting.text
    elsewhere = section(Side(upstream=client("2025-12-01")))
    assert "not read by this process" in elsewhere.text
    assert "Pinned version 2025-12-01" in elsewhere.text
    bare = section(None)  # no process state at all (the page served on its own)
    assert "Revision not read by this process" in bare.text
    assert "Pinned version — " in bare.text


def test_a_refused_version_shows_in_red_with_the_reason_without_query_strings():
    side = Side(upstream=client(), spec_check=object(), upstream_drift=report())
    error = side.upstream.pin.refusal(
        "/webhooks",
        "400 validation_failed",
        "validation_failed",
        "Service-API-Version 2026-08-20 is unknown, see https://up.example/v?key=s3cret",
        "Service-API-Version",
    )
    assert error is not None
    shown = section(side)
    assert '<span class="refused">refused by the upstream: Service-API-Version 2026' in shown.html
    assert "https://up.example/v?<redacted>" in shown.text
    assert "s3cret" not in shown.html
    side.upstream.pin.accepted()
    assert "refused" not in section(side).text


def test_endpoints_being_retired_show_their_dates_and_links_without_query_strings():
    side = Side(upstream=client(), spec_check=object(), upstream_drift=report())
    side.upstream.deprecations.observe(
        "/jobs/{id}",
        200,
        "@1787184000",
        SUNSET,
        [
            '<https://docs.example/jobs?token=abc>; rel="deprecation"',
            "<https://docs.example/s>; rel=sunset",
        ],
    )
    [notice] = announcements(side.upstream.deprecations)
    assert notice.links == (
        ("deprecation", "https://docs.example/jobs"),
        ("sunset", "https://docs.example/s"),
    )
    shown = section(side)
    assert "Endpoints being retired" in shown.text
    assert "/jobs/{id} 2026-08-20 00:00:00 UTC" in shown.text
    assert "2026-12-01 00:00:00 UTC" in shown.text
    assert "deprecation: https://docs.example/jobs" in shown.text
    assert "token=abc" not in shown.html
    # A later answer without the headers withdraws it.
    side.upstream.deprecations.observe("/jobs/{id}", 200, None, None, [])
    assert "Endpoints being retired" not in section(side).text
