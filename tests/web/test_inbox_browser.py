"""The inbox page in a real headless browser: Debian's Chromium, driven by Playwright.

One receiver (``receiver serve``, SQLite inbox, the simulator as upstream, HTTP sinks that
capture what they get) and one browser serve the whole module. A person signs in, sees a webhook
just sent appear, filters, opens it, redelivers it and sees the sink get it again; a payload
carrying a script shows as text and opens no dialog; a POST without the CSRF token changes
nothing.

With ``RECEIVER_SCREENSHOTS=docs`` the run saves the pages docs/inbox-page.md shows (``make
screenshots``). Chromium comes from Debian (``make browser-tools``): Playwright never downloads a
browser here.
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.helpers import ROOT
from tests.support.services import require_tool
from tests.support.upstream import rely_on
from tests.web.stack import ADMIN_TOKEN, Stack, running

XSS = "<script>alert(1)</script>"
TIMEOUT_MS = 20_000
# The overview's counts are the inbox gauges, refreshed every 5 s, or less often when counting
# takes longer (at most 2% of the time, receiver.app.gauge_refresh_interval): on a machine busy
# enough that two counts in a row take 0.5 s, the next comes 25 s later.
GAUGE_MS = 60_000

try:
    from playwright import sync_api as playwright_sync
except ImportError:  # pragma: no cover - the dev extra installs it
    if os.environ.get("RECEIVER_REQUIRE_SERVICES") == "1":
        raise
    pytest.skip("playwright is not installed (make browser-tools)", allow_module_level=True)
expect = playwright_sync.expect
expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running(tmp_path_factory.mktemp("inbox-browser")) as started:
        yield started


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    chromium = require_tool("chromium", installed_by="make browser-tools")
    with playwright_sync.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def signed_in(browser, stack):
    """A browser context signed in through the form, shared by the tests after the first."""
    context = browser.new_context(base_url=stack.ops_url, viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.goto("/ui/login")
    page.fill("input[name=token]", ADMIN_TOKEN)
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Overview")
    page.close()
    yield context
    context.close()


@pytest.fixture
def page(signed_in):
    """A fresh tab; any dialog (an alert a payload managed to run) is recorded, then dismissed."""
    tab = signed_in.new_page()
    dialogs: list[str] = []
    tab.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    yield tab
    tab.close()
    assert dialogs == [], f"the page opened dialogs: {dialogs}"


def screenshot(page, name: str) -> None:
    """Save the page for docs/inbox-page.md when RECEIVER_SCREENSHOTS names a folder (docs)."""
    folder = os.environ.get("RECEIVER_SCREENSHOTS")
    if folder:
        path = ROOT / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(path)), full_page=True)


def wait_until(predicate, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_sign_in_refuses_a_wrong_token_and_takes_the_right_one(browser, stack):
    context = browser.new_context(base_url=stack.ops_url)
    page = context.new_page()
    try:
        page.goto("/ui/")
        assert page.url.endswith("/ui/login?next=/ui/")
        page.fill("input[name=token]", "not-the-token")
        page.click("button[type=submit]")
        expect(page.get_by_role("alert")).to_contain_text("That is not the admin token")
        assert page.context.cookies() == []

        page.fill("input[name=token]", ADMIN_TOKEN)
        page.click("button[type=submit]")
        expect(page.locator("h1")).to_have_text("Overview")
        [cookie] = page.context.cookies()
        assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
        assert page.evaluate("document.cookie") == ""  # out of reach of any script

        page.click("text=Sign out")
        expect(page.locator("h1")).to_have_text("Sign in")
        page.goto("/ui/events")
        assert "/ui/login" in page.url
    finally:
        context.close()


def test_a_sent_webhook_appears_filters_opens_and_redelivers(page, stack):
    payload = stack.send("image", item_name="wave")
    event_id, job_id = payload["id"], payload["job_id"]
    wait_until(lambda: stack.consumer_got(event_id) == 1, "the consumer sink to get the event")

    page.goto("/ui/events")
    row = page.locator("table.events tbody tr", has_text=event_id)
    expect(row).to_have_count(1)
    expect(row.locator(".chip")).to_have_text(["consumer"])  # archive takes job.failed only

    # Filter: by job id (the form), then by sink and state.
    page.fill("input[name=q]", job_id)
    page.click("text=Filter")
    expect(page.locator("table.events tbody tr")).to_have_count(1)
    expect(page.locator("table.events tbody tr")).to_contain_text(event_id)
    page.select_option("select[name=sink]", "consumer")
    page.select_option("select[name=state]", "done")
    page.click("text=Filter")
    expect(page.locator("table.events tbody tr")).to_have_count(1)
    page.select_option("select[name=sink]", "archive")
    page.click("text=Filter")
    expect(page.locator("text=No event matches.")).to_be_visible()
    page.fill("input[name=q]", "")
    page.select_option("select[name=sink]", "consumer")
    page.fill("input[name=event]", "job.completed")
    page.click("text=Filter")
    expect(page.locator("table.events tbody tr").first).to_contain_text(event_id)

    # The detail page: its id, the body as received, each delivery.
    page.goto(f"/ui/events?q={event_id}")
    page.click(f"table.events a:text-is('{event_id}')")
    expect(page.locator("#event-id")).to_have_text(event_id)
    expect(page.locator("#body")).to_contain_text(f'"job_id": "{job_id}"')
    consumer = page.locator("tr[data-sink=consumer]")
    expect(consumer.locator(".badge")).to_have_text("done")
    expect(consumer.locator("td.num")).to_have_text("1")

    # Redeliver the consumer's delivery: the sink gets the event again.
    consumer.locator("button", has_text="Redeliver").click()
    expect(page.get_by_role("status")).to_have_text("1 delivery queued again.")
    wait_until(lambda: stack.consumer_got(event_id) == 2, "the redelivery to reach the sink")
    page.reload()
    expect(page.locator("tr[data-sink=consumer] .badge")).to_have_text("done")


def test_a_payload_with_a_script_shows_as_text(page, stack):
    rely_on(stack.sim, job=["item_name"])  # the fetched job carries the hostile name too
    payload = stack.send("image", item_name=XSS, extra={"item_name": XSS})
    page.goto(f"/ui/events/{payload['id']}")
    expect(page.locator("#body")).to_contain_text(f'"item_name": "{XSS}"')
    # The job as fetched from the upstream carries the same name.
    wait_until(lambda: stack.consumer_got(payload["id"]) == 1, "the consumer to get it")
    page.reload()
    expect(page.locator("#snapshot")).to_contain_text(f'"item_name": "{XSS}"')
    assert page.locator("script:not([src])").count() == 0
    page.goto("/ui/events")
    page.goto("/ui/")
    # (the fixture asserts that no dialog opened on any of these pages)


def test_a_post_without_the_csrf_token_is_refused(page, stack):
    payload = stack.send("logo", item_name="csrf")
    wait_until(lambda: stack.consumer_got(payload["id"]) == 1, "the consumer to get it")
    page.goto(f"/ui/events/{payload['id']}")
    url = f"{stack.ops_url}/ui/events/{payload['id']}/redeliver"
    # The browser's own cookie goes along; only the form's CSRF field is missing or wrong.
    refused = page.request.post(url, form={"sink": "consumer"}, max_redirects=0)
    assert refused.status == 403
    assert "CSRF" in refused.text()
    wrong = page.request.post(url, form={"sink": "consumer", "csrf": "f" * 64}, max_redirects=0)
    assert wrong.status == 403
    # A GET on the action's address changes nothing either.
    assert page.request.get(url, max_redirects=0).status == 405
    time.sleep(0.5)
    assert stack.consumer_got(payload["id"]) == 1


def dead_on_the_gauge(stack: Stack) -> bool:
    """Whether the receiver's inbox gauge (what the overview's cards show, refreshed every 5 s)
    counts a dead event yet."""
    with urllib.request.urlopen(f"{stack.ops_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = re.search(r'^receiver_inbox_events\{state="dead"\} (\S+)$', text, re.M)
    return found is not None and float(found.group(1)) > 0


def test_overview_refreshes_itself_and_dead_letters_redeliver(page, stack):
    for kind, name in [("animation", "jump"), ("failed", "spin"), ("scene", "beach")]:
        stack.send(kind, item_name=name)
    # The failed job's event dies at the archive sink (503 twice); once the inbox gauge counts
    # it, the page opens and its first render shows it (the page's own refresh is checked
    # below, with a new event).
    wait_until(lambda: dead_on_the_gauge(stack), "a dead event on the inbox gauge", GAUGE_MS / 1000)
    page.goto("/ui/")
    lanes = page.locator("table.lanes tbody tr")
    expect(lanes).to_have_count(2)
    expect(lanes.nth(0)).to_contain_text("consumer")
    expect(lanes.nth(1)).to_contain_text("archive")
    expect(page.locator("text=Upstream subscriptions")).to_be_visible()
    expect(page.locator("table td .badge", has_text="active")).to_have_count(1)
    expect(page.locator(".card.dead .value")).not_to_have_text("0")

    # A new event shows on the open overview without a reload (it refreshes every 5 s).
    done = page.locator(".card.done .value")
    before = int(done.inner_text())
    stack.send("image", item_name="late")
    expect(page.locator(".card.pending .value")).to_have_text(re.compile(r"\d+"))
    page.wait_for_function(
        "n => Number(document.querySelector('.card.done .value').textContent) > n"
        " || Number(document.querySelector('.card.pending .value').textContent) > 0",
        arg=before,
        timeout=GAUGE_MS,
    )
    screenshot(page, "ui-overview.png")

    page.goto("/ui/dead")
    group = page.locator("table.dead tbody tr", has_text="archive")
    expect(group).to_have_count(1)
    expect(group.locator("td.error")).to_contain_text("503")
    screenshot(page, "ui-dead.png")
    archived = len(stack.archive.requests)
    group.locator("button").click()
    expect(page.get_by_role("status")).to_contain_text("queued again")
    wait_until(lambda: len(stack.archive.requests) > archived, "the archive sink to be retried")


def test_screenshots_of_the_events_list_and_an_event(page, stack):
    payload = stack.send("image", item_name="wave-hello")
    wait_until(lambda: stack.consumer_got(payload["id"]) == 1, "the consumer to get it")
    page.goto("/ui/events")
    expect(page.locator("table.events tbody tr").first).to_be_visible()
    screenshot(page, "ui-events.png")
    page.goto(f"/ui/events/{payload['id']}")
    expect(page.locator("#event-id")).to_have_text(payload["id"])
    screenshot(page, "ui-event.png")


def test_an_events_timeline_shows_where_its_time_went(page, stack):
    stack.consumer.fail_times(2)  # 500, 500, then 200: three attempts
    payload = stack.send("image", item_name="wave-late")
    event_id = payload["id"]
    wait_until(lambda: stack.consumer_got(event_id) == 3, "the third attempt to reach the sink")
    attempts = page.locator("svg.timeline rect.attempt")

    def three_attempts() -> bool:
        page.goto(f"/ui/events/{event_id}")
        return attempts.count() == 3

    wait_until(three_attempts, "three attempts on the timeline")
    expect(page.locator("svg.timeline rect.attempt.retry")).to_have_count(2)
    expect(page.locator("svg.timeline rect.attempt.delivered")).to_have_count(1)
    expect(page.locator("svg.timeline rect.mark")).to_have_count(2)  # received, stored
    expect(page.locator("svg.timeline rect.call").first).to_be_visible()
    # Each bar says what it was on hover; the steps are listed below with their errors.
    expect(attempts.first.locator("title")).to_contain_text("attempt 1: retry, HTTP 500")
    steps = page.locator("table.steps tbody tr")
    expect(steps.filter(has_text="GET /jobs/{id}")).to_have_count(1)
    expect(steps.filter(has_text="attempt")).to_have_count(3)
    expect(steps.filter(has_text="HTTP 500")).to_have_count(2)
    box = page.locator("svg.timeline").bounding_box()
    assert box is not None and box["width"] > 600
    folder = os.environ.get("RECEIVER_SCREENSHOTS")
    if folder:
        page.locator("#timeline").screenshot(path=str(ROOT / folder / "ui-timeline.png"))

    # The admin API gives the same steps.
    answer = page.request.get(
        f"/admin/events/{event_id}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert answer.ok
    data = answer.json()["data"]
    tried = [
        (s["attempt"], s["outcome"], s["status"]) for s in data["steps"] if s["kind"] == "attempt"
    ]
    assert tried == [(1, "retry", 500), (2, "retry", 500), (3, "delivered", 200)]
    assert data["stored_at"] >= data["received_at"] - 1
