"""The overview's "Upstream API" section in a real browser, against the simulator as upstream.

One receiver (``receiver serve``, reading the simulator's ``/v1/openapi.json`` every 3 s) and one
browser serve the module. A person opens the overview and sees the upstream's revision, the
pinned API version and "no difference that matters"; the simulator then serves a drifted
document (a job status gaining ``queued``, the job's ``item_name`` gone, the job endpoint
deprecated) and announces the job endpoint's Deprecation and Sunset, and the open page shows
each finding and the retired endpoint with its dates; the simulator refuses the pinned version,
and the page says so in red with the upstream's reason until it accepts it again.

With ``RECEIVER_SCREENSHOTS=docs`` the run saves docs/ui-upstream.png (the section with a
breaking drift), shown in docs/upstream.md (``make screenshots``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from receiver.simulator.versions import JOBS_DEPRECATED_AT
from receiver.web.render import format_time
from tests.support.helpers import ROOT
from tests.web import test_inbox_browser as inbox
from tests.web.stack import Stack, running

# The inbox browser module's fixtures (a browser and a signed-in tab), over this module's stack.
browser, signed_in, page = inbox.browser, inbox.signed_in, inbox.page
expect, wait_until = inbox.expect, inbox.wait_until

SUNSET_DAYS = 20
PINNED = "2026-08-20"  # api.version's default


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running(tmp_path_factory.mktemp("upstream-browser"), spec_check_minutes=0.05) as started:
        yield started


def test_no_drift_shows_the_revision_the_pinned_version_and_no_difference(page, stack):
    page.goto("/ui/")
    section = page.locator("#upstream-api")
    expect(section.locator("h2")).to_have_text("Upstream API")
    # The first look ends shortly after start; the page refreshes itself until it shows it.
    expect(section.locator("#upstream-no-drift")).to_contain_text("No difference that matters")
    expect(section.locator("#upstream-revision")).to_contain_text(
        "1.14.0 (this release was built against 1.14.0)"
    )
    expect(section.locator("#upstream-pin")).to_contain_text(f"{PINNED} (api.version)")
    expect(section.locator(".refused")).to_have_count(0)
    expect(section.locator("table.findings")).to_have_count(0)
    expect(section).to_contain_text("Last read")


def test_a_breaking_drift_and_a_retired_endpoint_show_on_the_open_page(page, stack):
    sim = stack.sim
    try:
        sim.jobs_deprecated = True
        sim.jobs_sunset_at = round(sim.now() + SUNSET_DAYS * 86400)
        page.goto("/ui/")
        section = page.locator("#upstream-api")
        expect(section.locator("#upstream-no-drift")).to_be_visible()
        sim.spec_drift = "breaking"
        # A job fetched now carries the endpoint's Deprecation and Sunset headers.
        payload = stack.send("image", item_name="drift")
        wait_until(lambda: stack.consumer_got(payload["id"]) == 1, "the consumer to get it")

        # Without a reload: the next look finds the drift, the page's refresh shows it.
        expect(section.locator("#upstream-revision")).to_contain_text(
            "1.16.0 (this release was built against 1.14.0)"
        )
        rows = section.locator("table.findings tbody tr")
        status = rows.filter(has_text="job.status")
        expect(status).to_have_count(1)
        expect(status.locator(".badge")).to_have_text("breaking")
        expect(status).to_contain_text("new value 'queued': the receiver acts on this field")
        expect(rows.filter(has_text="job.item_name").locator(".badge")).to_have_text("breaking")
        expect(rows.filter(has_text="marked deprecated").locator(".badge")).to_have_text("notice")
        expect(rows.first.locator(".badge")).to_have_text("breaking")  # breaking first
        expect(section.locator("#upstream-no-drift")).to_have_count(0)

        retired = section.locator("table.announcements tr[data-endpoint='/jobs/{id}']")
        expect(retired).to_contain_text(format_time(JOBS_DEPRECATED_AT))
        expect(retired).to_contain_text(format_time(sim.jobs_sunset_at))
        expect(retired).to_contain_text("in 19 d")  # the sunset, counted from now
        expect(retired).to_contain_text("deprecation: https://docs.example.invalid/deprecations")
        folder = os.environ.get("RECEIVER_SCREENSHOTS")
        if folder:
            section.screenshot(path=str(ROOT / folder / "ui-upstream.png"))
    finally:
        sim.spec_drift, sim.jobs_deprecated, sim.jobs_sunset_at = "none", False, None
    # The upstream mends it: the next look and the next fetched job clear the section.
    payload = stack.send("image", item_name="mended")
    wait_until(lambda: stack.consumer_got(payload["id"]) == 1, "the consumer to get it")
    expect(section.locator("#upstream-no-drift")).to_be_visible()
    expect(section.locator("table.announcements")).to_have_count(0)


def test_a_refused_version_shows_in_red_until_the_upstream_accepts_it(page, stack):
    page.goto("/ui/")
    refused = page.locator("#upstream-pin .refused")
    expect(refused).to_have_count(0)
    try:
        stack.sim.api_versions = frozenset({"2025-12-01"})
        # The watchdog's next list (every 2 s) carries the pinned version and is refused.
        expect(refused).to_contain_text(
            f"refused by the upstream: Service-API-Version {PINNED} is not a version this "
            "service knows (2025-12-01)"
        )
        color = refused.evaluate("node => getComputedStyle(node).color")
        assert color == "rgb(180, 35, 24)"  # the page's red (--dead)
    finally:
        stack.sim.api_versions = None
    expect(refused).to_have_count(0)
    expect(page.locator("#upstream-pin")).to_contain_text(PINNED)
