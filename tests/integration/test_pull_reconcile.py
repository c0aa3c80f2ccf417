"""Reconcile over real HTTP: a collection of 250 assets on 3 pages of the simulator, some already
delivered by webhook, some not ready; the missing ones are delivered once, a second run
delivers nothing; 429 with Retry-After on the pages is waited out; the CLI shows progress and a
summary while the receiver serves."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from structlog.testing import capture_logs

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.errors import ReceiverError
from receiver.pull.reconcile import Reconciler
from receiver.simulator.shape import NULL
from receiver.store.asset_ledger import FORGOTTEN_BEFORE, LedgerEntry
from receiver.store.records import Snapshot
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import write_config
from tests.support.peers import Capture
from tests.support.pull import (
    SECRET,
    idle,
    metric,
    receiver_config,
    send_webhook,
    serve_simulator,
)
from tests.support.store_cases import new_event

COLLECTION = "3f1c2a4e-5b6d-4e7f-8a9b-0c1d2e3f4a5b"


@pytest.fixture
async def upstream(aiohttp_server):
    return await serve_simulator(aiohttp_server, seed=29)


config_data = receiver_config


def reconciler_for(runtime, **options):
    """A reconciler on the running receiver's store, upstream client and worker."""
    return Reconciler(
        settings=runtime.settings,
        store=runtime.store,
        upstream=runtime.upstream,
        metrics=runtime.metrics,
        on_event=runtime.wake_worker,
        **options,
    )


@pytest.fixture
async def capture(aiohttp_server):
    capture = Capture()
    server = await aiohttp_server(capture.app())
    capture.url = str(server.make_url("/hook"))
    return capture


@pytest.fixture
async def serving(aiohttp_client, tmp_path, upstream, capture):
    data = config_data(tmp_path, upstream)
    data["sinks"].append({"name": "forward", "type": "http", "url": capture.url, "secret": "s"})
    runtime = Runtime(parse_settings(data, env={}))
    with capture_logs():
        async with runtime:
            public = await aiohttp_client(runtime.public_app())
            yield runtime, public, upstream


def collection_of(sim, *, webhooked=30, processing=5, total_jobs=125):
    """``total_jobs`` image jobs (2 assets each) in COLLECTION: the first ``webhooked`` to be
    sent by webhook, the last ``processing`` still running."""
    payloads = []
    for n in range(total_jobs):
        status = "processing" if n >= total_jobs - processing else "completed"
        payloads.append(sim.add_job("image", status=status, collection_id=COLLECTION))
    return payloads[:webhooked], payloads


def files(root):
    return sorted(p.name for p in root.rglob("*") if p.is_file())


def _pair(sim, asset_type, ident):
    """The (job id, asset type) a delivered file stands for: named by its asset id, or (a file
    taken from the job's ``urls``) by its job id."""
    asset = sim.assets.get(ident)
    return (asset.job_id, asset.type) if asset is not None else (ident, asset_type)


def files_delivered(sim, root):
    """How often each (job id, asset type) arrived as a file of the download sink."""
    found = Counter()
    for name in files(root):
        asset_type, _, ident = name.split(".", 1)[0].partition("-")
        found[_pair(sim, asset_type, ident)] += 1
    return found


def posts_delivered(sim, capture):
    """How often each (job id, asset type) arrived in an http-sink delivery."""
    found = Counter()
    for request in capture.requests:
        enriched = json.loads(request.body)
        if enriched["assets"]:
            for asset in enriched["assets"]:
                found[_pair(sim, asset["type"], asset["id"])] += 1
        else:
            for asset_type in enriched["job"].get("urls") or {}:
                found[(enriched["job"]["id"], asset_type)] += 1
    return found


def completed_pairs(sim, payloads):
    return {
        (p["job_id"], asset.type)
        for p in payloads
        if sim.job_status(p["job_id"]) == "completed"
        for asset in sim.assets.values()
        if asset.job_id == p["job_id"]
    }


@pytest.mark.parametrize("rate_limited", [False, True], ids=["plain", "429-first"])
async def test_assets_without_a_job_reference_are_delivered_once_each(
    serving, tmp_path, capture, rate_limited
):
    """The spec's asset: ``metadata`` null on every one (nothing names the job), pages of
    varying size, webhook bodies and jobs with or without their optional fields."""
    runtime, public, sim = serving
    sim.shape.pin("asset", "metadata", NULL)
    webhooked, payloads = collection_of(sim)
    for payload in webhooked:
        await send_webhook(public, payload)
    await idle(runtime)
    by_webhook = files_delivered(sim, tmp_path / "dl")
    assert by_webhook and set(by_webhook) <= completed_pairs(sim, webhooked)
    if rate_limited:
        sim.rate_limit_burst(2, retry_after=0, route="GET /v1/collections/{id}/assets")

    first = await reconciler_for(runtime).run(COLLECTION)
    await idle(runtime)
    second = await reconciler_for(runtime).run(COLLECTION)

    assert first.retries == (2 if rate_limited else 0)
    assert sim.requests["GET /v1/collections/{id}/assets"] >= 2 * 3  # several pages, twice
    assert (first.seen, first.not_ready, second.seen, second.not_ready) == (250, 10, 250, 10)
    assert first.newly_delivered == 240 - sum(by_webhook.values())
    assert first.already_delivered == sum(by_webhook.values())
    assert (second.newly_delivered, second.events, second.already_delivered) == (0, 0, 240)
    expected = completed_pairs(sim, payloads)
    assert len(expected) == 240
    for delivered in (files_delivered(sim, tmp_path / "dl"), posts_delivered(sim, capture)):
        assert set(delivered) == expected
        assert set(delivered.values()) == {1}  # each completed asset once, in every sink

    # The jobs still running finish: the next run delivers them, and only them.
    for payload in payloads[-5:]:
        sim.complete_job(payload["job_id"])
    third = await reconciler_for(runtime).run(COLLECTION, dry_run=True)
    assert (third.newly_delivered, third.events) == (10, 0)
    third = await reconciler_for(runtime).run(COLLECTION)
    await idle(runtime)
    assert (third.newly_delivered, third.not_ready) == (10, 0)
    expected = completed_pairs(sim, payloads)
    for delivered in (files_delivered(sim, tmp_path / "dl"), posts_delivered(sim, capture)):
        assert set(delivered) == expected and set(delivered.values()) == {1}
    assert metric(runtime, "receiver_pull_events_total", {"source": "reconcile"}) == (
        first.events + third.events
    )


@pytest.mark.parametrize("shape", ["full", "minimal", "mixed"])
async def test_every_shape_ends_with_each_asset_once(
    aiohttp_server, aiohttp_client, tmp_path, shape
):
    sim = await serve_simulator(aiohttp_server, seed=31, shape=shape)
    runtime = Runtime(parse_settings(config_data(tmp_path, sim), env={}))
    with capture_logs():
        async with runtime:
            public = await aiohttp_client(runtime.public_app())
            webhooked, payloads = collection_of(sim, webhooked=20, processing=0, total_jobs=40)
            for payload in webhooked:
                await send_webhook(public, payload)
            await idle(runtime)
            summary = await reconciler_for(runtime).run(COLLECTION)
            await idle(runtime)
    delivered = files_delivered(sim, tmp_path / "dl")
    assert set(delivered) == completed_pairs(sim, payloads)
    assert set(delivered.values()) == {1}
    assert summary.seen == 80 and not summary.failed


async def test_files_a_download_sink_already_holds_count_as_delivered(serving, tmp_path):
    runtime, _public, sim = serving
    _webhooked, payloads = collection_of(sim, webhooked=0, processing=0, total_jobs=3)
    held = payloads[0]
    job = sim.jobs[held["job_id"]]
    for asset in sim.assets.values():
        if asset.job_id == held["job_id"]:
            path = (
                tmp_path / "dl" / COLLECTION / str(job.item_name) / f"{asset.type}-{asset.id}.png"
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"written by an earlier run")
    reconciler = reconciler_for(runtime)
    summary = await reconciler.run(COLLECTION)
    assert (summary.already_delivered, summary.newly_delivered) == (2, 4)
    stored = [e.payload()["asset_ids"] for e in await runtime.store.list()]
    named = {asset_id for asset_ids in stored for asset_id in asset_ids.values()}
    assert named == {a.id for a in sim.assets.values() if a.job_id != held["job_id"]}


async def test_429_with_retry_after_on_a_page_is_waited_out(serving):
    runtime, _public, sim = serving
    collection_of(sim, webhooked=0, processing=0, total_jobs=60)
    sim.rate_limit_burst(2, retry_after=1, route="GET /v1/collections/{id}/assets")
    waits = []

    async def sleep(seconds):
        waits.append(seconds)

    reconciler = reconciler_for(runtime, sleep=sleep)
    summary = await reconciler.run(COLLECTION)
    assert summary.seen == 120 and summary.newly_delivered == 120
    assert summary.retries == 2
    assert len(waits) == 2 and all(w >= 1 for w in waits)  # not the 0.05 s backoff
    assert sim.responses["GET /v1/collections/{id}/assets", 429] == 2


async def test_the_cli_reconciles_while_the_receiver_serves(serving, tmp_path):
    runtime, _public, sim = serving
    collection_of(sim, webhooked=0, processing=2, total_jobs=60)
    config = write_config(tmp_path / "config.toml", config_data(tmp_path, sim))

    code, out, err = await run_cli(
        "reconcile", "--config", str(config), "--collection", COLLECTION, "--dry-run"
    )
    assert code == 0, err
    assert "to deliver 116" in out and "nothing stored" in out
    assert await runtime.store.list() == []

    code, out, err = await run_cli("reconcile", "--config", str(config), "--collection", COLLECTION)
    assert code == 0, err
    assert out.strip() == (
        f"collection {COLLECTION}: seen 120, already delivered 0, newly delivered 116, not ready 4"
    )
    # Not a terminal: one progress line per page, then the summary on stdout.
    assert err.splitlines() == [
        "[" + "#" * 25 + "." * 5 + "] 100/120 assets, page 1",
        "[" + "#" * 30 + "] 120/120 assets, page 2",
    ]
    runtime.wake_worker()
    await idle(runtime)
    assert len(files(tmp_path / "dl")) == 116

    code, out, err = await run_cli("reconcile", "--config", str(config), "--collection", COLLECTION)
    assert code == 0, err
    assert "already delivered 116, newly delivered 0, not ready 4" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--collection", "my-collection"], "is not a collection id"),
        (["--collection", COLLECTION, "--since", "last tuesday"], "--since"),
        ([], "--collection"),
    ],
)
async def test_bad_reconcile_arguments_are_one_line(tmp_path, args, needle):
    config = write_config(
        tmp_path / "config.toml",
        {"webhook": {"secrets": [SECRET]}, "store": {"url": f"sqlite:///{tmp_path}/inbox.db"}},
    )
    code, out, err = await run_cli("reconcile", "--config", str(config), *args)
    assert code == 2 and out == ""
    assert_one_clean_line(err)
    assert len(err.strip().splitlines()) == 1 and needle in err
    assert not (tmp_path / "inbox.db").exists()


async def test_an_unknown_collection_is_one_line(tmp_path, upstream):
    config = write_config(tmp_path / "config.toml", config_data(tmp_path, upstream))
    code, _out, err = await run_cli(
        "reconcile", "--config", str(config), "--collection", str(uuid.uuid4())
    )
    assert code == 1
    assert_one_clean_line(err)
    assert "not found" in err


async def test_a_listing_that_points_back_ends_the_run_with_an_error(serving):
    """A page whose ``meta.pagination`` would send the run back (or nowhere) is refused, not
    followed forever."""
    runtime, _public, _sim = serving

    class Backwards:
        calls = 0

        async def collection_assets_page(self, collection_id, *, offset=0, limit=100):
            self.calls += 1
            page = [{"id": f"a{offset}", "type": "image", "status": "processing"}]
            return page, {"total": 10, "limit": 1, "offset": 0, "has_more": True}

    upstream = Backwards()
    reconciler = Reconciler(settings=runtime.settings, store=runtime.store, upstream=upstream)
    with pytest.raises(ReceiverError, match="points back"):
        await reconciler.run(COLLECTION)
    assert upstream.calls == 2


async def test_assets_older_than_what_the_ledger_forgot_are_skipped_not_delivered_again(serving):
    """Until the ledger has forgotten anything, an old asset never delivered is delivered; once
    rows up to a time were forgotten (store.ledger_retention_days), an asset created before
    then may have been delivered and forgotten, so the run skips it with that reason."""
    runtime, _public, _sim = serving
    now = datetime.now(UTC)

    class Listing:
        async def collection_assets_page(self, collection_id, *, offset=0, limit=100):
            def asset(ident, age_days):
                return {
                    "id": ident,
                    "type": "image",
                    "status": "completed",
                    "item_id": f"item-{ident}",
                    "created_at": (now - timedelta(days=age_days)).isoformat(),
                }

            page = [asset("old", 40), asset("new", 20)]
            return page, {"total": 2, "limit": 100, "offset": 0, "has_more": False}

    reconciler = Reconciler(settings=runtime.settings, store=runtime.store, upstream=Listing())
    summary = await reconciler.run(COLLECTION, dry_run=True)
    assert (summary.newly_delivered, summary.skipped) == (2, Counter()), summary

    # The ledger forgets a row of an event long pruned, up to 30 days ago.
    store, forgotten_up_to = runtime.store, (now - timedelta(days=30)).timestamp()
    old = forgotten_up_to - 86400
    await store.add_event(new_event("long-gone", received_at=old, sinks=()))
    gone = Snapshot(job={"id": "job-long-gone"}, assets=(), fetched_at=old)
    await store.save_snapshot("long-gone", gone, ledger=[LedgerEntry("asset a0")], now=old)
    assert await store.prune(older_than=old + 1) == 1
    assert await store.prune_ledgers_step(older_than=forgotten_up_to, limit=10) == 2
    assert await store.ledger([FORGOTTEN_BEFORE]) == {FORGOTTEN_BEFORE: forgotten_up_to}
    summary = await reconciler.run(COLLECTION, dry_run=True)
    assert summary.skipped == Counter({"before the ledger's retention": 1}), summary
    assert summary.newly_delivered == 1
