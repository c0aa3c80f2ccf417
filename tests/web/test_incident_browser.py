"""An incident on the inbox page, in a real browser: pause a lane from the overview, preview a
batch of its dead letters on the dead-letters page, start it, see it wait in the paused lane,
resume the lane and watch the batch reach done.

With ``RECEIVER_SCREENSHOTS=docs`` the run saves docs/ui-redelivery.png (a batch in progress)
and docs/ui-lane-paused.png (a paused lane), shown in docs/incidents.md (``make screenshots``).
"""

from __future__ import annotations

import json

from tests.web import test_inbox_browser as inbox
from tests.web.stack import ADMIN_TOKEN

# The inbox browser module's fixtures (a receiver and a browser for this module).
stack, browser, signed_in, page = inbox.stack, inbox.browser, inbox.signed_in, inbox.page
expect, screenshot, wait_until = inbox.expect, inbox.screenshot, inbox.wait_until


def archive_state(page, stack, event_id: str) -> str:
    answer = page.request.get(
        f"{stack.ops_url}/admin/events/{event_id}",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    deliveries = json.loads(answer.text())["data"]["deliveries"]
    return next(d["state"] for d in deliveries if d["sink"] == "archive")


def test_pause_a_lane_redeliver_its_dead_letters_in_a_batch_then_resume(page, stack):
    payloads = [
        stack.send("failed", item_name=f"broken-{i}") for i in range(2)
    ]  # 4 failures: below the circuit breaker
    for payload in payloads:
        wait_until(lambda p=payload: archive_state(page, stack, p["id"]) == "dead", "dead")
    stack.archive.status = 200  # the archive is mended; hold its lane while checking first

    page.goto("/ui/")
    row = page.locator("table.lanes tr[data-lane=archive]")
    row.locator("select[name=for]").select_option("1h")
    row.locator("input[name=reason]").fill("archive host maintenance")
    row.locator("button", has_text="Pause").click()
    row = page.locator("table.lanes tr[data-lane=archive]")
    expect(row.locator(".badge")).to_have_text("paused")
    expect(row).to_contain_text("archive host maintenance")

    # Preview on the dead-letters page: a count and a sample, nothing changed yet.
    page.goto("/ui/dead")
    form = page.locator("#batch form.filters")
    form.locator("select[name=status]").select_option("dead")
    form.locator("select[name=sink]").select_option("archive")
    form.locator("input[name=since]").fill("1h")
    page.click("#preview-batch")
    expect(page.locator("#preview .matched")).to_have_text("2")
    expect(page.locator("#preview table.sample tbody tr")).to_have_count(2)
    assert archive_state(page, stack, payloads[0]["id"]) == "dead"

    archived = len(stack.archive.requests)
    page.click("#start-batch")
    expect(page.locator("h1")).to_contain_text("Redelivery")
    expect(page.locator("#queued")).to_have_text("2")
    expect(page.locator("#batch-state .badge")).to_have_text("running")
    expect(page.locator("#pending")).to_have_text("2")  # waiting in the paused lane
    screenshot(page, "ui-redelivery.png")
    batch_url = page.url
    assert len(stack.archive.requests) == archived

    page.goto("/ui/")
    row = page.locator("table.lanes tr[data-lane=archive]")
    expect(row.locator("td.num").first).to_have_text("2")  # its backlog
    screenshot(page, "ui-lane-paused.png")
    row.locator("button", has_text="Resume").click()
    expect(page.locator("table.lanes tr[data-lane=archive] .badge")).to_have_text("running")

    page.goto(batch_url)  # refreshes itself until done
    expect(page.locator("#batch-state .badge")).to_have_text("done")
    expect(page.locator("#delivered")).to_have_text("2")
    expect(page.locator("#failed")).to_have_text("0")
    assert len(stack.archive.requests) == archived + 2
    for payload in payloads:
        assert archive_state(page, stack, payload["id"]) == "done"
    page.goto("/ui/redeliveries")
    expect(page.locator("table.batches tbody tr").first).to_contain_text("done")
