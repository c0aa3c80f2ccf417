"""The asset ledger's rules: what an event's snapshot takes in charge, and which stored event
counts as one reconcile made for assets that name no job."""

from __future__ import annotations

from receiver.delivery.enrich import without_job
from receiver.pull.events import unit_job_id
from receiver.store.asset_ledger import ledger_entries, upstream_time, url_key

JOB = "0b7c3f7e-1f52-4a43-a1b1-7e5b0d9f6a10"
ITEM = "5f7d1e3a-2b9c-4d8e-9f01-23456789abcd"


def keys(entries):
    return {e.key: e.upstream_time for e in entries}


def test_fetched_assets_are_taken_by_id():
    job = {"id": JOB, "status": "completed", "urls": {"image": "https://cdn/x.png?sig=1"}}
    assets = ({"id": "a1", "type": "image"}, {"id": "a1", "type": "image"}, {"type": "x"})
    assert keys(ledger_entries("job.completed", JOB, job, assets)) == {
        f"job {JOB}": None,
        "asset a1": None,
    }


def test_files_from_the_job_urls_are_taken_by_type_address_and_item():
    job = {
        "id": JOB,
        "status": "completed",
        "item_id": ITEM,
        "updated_at": "2026-11-26T10:00:00Z",
        "urls": {"image": "https://cdn.example/files/a.png?expires=1&sig=2"},
    }
    assert keys(ledger_entries("job.completed", JOB, job, ())) == {
        f"job {JOB}": None,
        f"job {JOB} image": None,
        "url https://cdn.example/files/a.png": None,
        f"item {ITEM} image": upstream_time("2026-11-26T10:00:00Z"),
    }


def test_nothing_is_taken_by_a_failed_or_unfinished_job():
    assert ledger_entries("job.failed", JOB, {"status": "failed"}, ()) == []
    assert ledger_entries("job.completed", JOB, {"status": "processing"}, ()) == []
    assert ledger_entries("job.completed", JOB, {}, ()) == []


def test_url_keys_drop_the_query_and_refuse_what_is_not_an_address():
    assert url_key("https://h/p/f.png?sig=abc#x") == "url https://h/p/f.png"
    assert url_key(None) is None and url_key("") is None and url_key("/relative") is None


def test_only_the_receivers_own_jobless_event_skips_the_job_fetch():
    item_event = {
        "source": "reconcile",
        "reconcile_unit": "item",
        "item_id": ITEM,
        "job_id": unit_job_id("item", ITEM),
        "asset_ids": {"image": "a1", "image_2": "a2"},
    }
    asset_event = {
        "source": "reconcile",
        "reconcile_unit": "asset",
        "job_id": unit_job_id("asset", "a1"),
        "asset_ids": {"image": "a1"},
    }
    assert without_job(item_event) and without_job(asset_event)
    # The same fields on a webhook naming a real job: its job is fetched as usual.
    assert not without_job({**item_event, "job_id": JOB})
    assert not without_job({**asset_event, "asset_ids": {"image": "a1", "video": "a2"}})
    assert not without_job({**item_event, "source": "webhook"})
    assert not without_job({**item_event, "reconcile_unit": "job"})
