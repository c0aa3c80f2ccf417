"""Reconcile over real HTTP: a collection of 250 assets on 3 pages of the simulator, some already
delivered by webhook, some not ready; the missing ones are delivered once, a second run
delivers nothing; 429 with Retry-After on the pages is waited out; the CLI shows progress and a
summary while the receiver serves."""

from __future__ import annotations

import uuid

import pytest
from structlog.testing import capture_logs

from receiver.app import Runtime
from receiver.config import parse_settings
from receiver.pull.reconcile import Reconciler
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import write_config
from tests.support.pull import (
    SECRET,
    idle,
    metric,
    receiver_config,
    send_webhook,
    serve_simulator,
    successes,
)

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
async def serving(aiohttp_client, tmp_path, upstream):
    runtime = Runtime(parse_settings(config_data(tmp_path, upstream), env={}))
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


async def test_a_reconcile_delivers_what_is_missing_once(serving, tmp_path):
    runtime, public, sim = serving
    webhooked, payloads = collection_of(sim)
    for payload in webhooked:
        await send_webhook(public, payload)
    await idle(runtime)
    assert len(files(tmp_path / "dl")) == 60

    reconciler = reconciler_for(runtime)
    pages = []
    first = await reconciler.run(COLLECTION, progress=lambda s: pages.append(s.pages))
    await idle(runtime)
    second = await reconciler.run(COLLECTION)

    assert sim.requests["GET /v1/collections/{id}/assets"] == 6  # 3 pages, twice
    assert pages[:3] == [1, 2, 3]
    assert (first.seen, first.already_delivered, first.newly_delivered, first.not_ready) == (
        250,
        60,
        180,
        10,
    )
    assert first.events == 90
    assert (second.seen, second.already_delivered, second.newly_delivered, second.not_ready) == (
        250,
        240,
        0,
        10,
    )
    names = files(tmp_path / "dl")
    expected = sorted(
        f"{kind}-{asset_id}.png"
        for payload in payloads[:-5]
        for kind, asset_id in payload["asset_ids"].items()
    )
    assert names == expected
    assert successes(runtime) == 30 + 90  # every job's files delivered once
    assert metric(runtime, "receiver_pull_events_total", {"source": "reconcile"}) == 90

    # The jobs still running finish: the next run delivers them, and only them.
    for payload in payloads[-5:]:
        sim.complete_job(payload["job_id"])
    reconciler = reconciler_for(runtime)
    third = await reconciler.run(COLLECTION, dry_run=True)
    assert (third.newly_delivered, third.events) == (10, 0)
    third = await reconciler.run(COLLECTION)
    runtime.wake_worker()
    await idle(runtime)
    assert (third.newly_delivered, third.not_ready, third.events) == (10, 0, 5)
    assert len(files(tmp_path / "dl")) == 250


async def test_files_a_download_sink_already_holds_count_as_delivered(serving, tmp_path):
    runtime, _public, sim = serving
    _webhooked, payloads = collection_of(sim, webhooked=0, processing=0, total_jobs=3)
    held = payloads[0]
    job = sim.jobs[held["job_id"]]
    for kind, asset_id in held["asset_ids"].items():
        path = tmp_path / "dl" / COLLECTION / str(job.item_name) / f"{kind}-{asset_id}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"written by an earlier run")
    reconciler = reconciler_for(runtime)
    summary = await reconciler.run(COLLECTION)
    assert (summary.already_delivered, summary.newly_delivered) == (2, 4)
    assert {e.job_id for e in await runtime.store.list()} == {p["job_id"] for p in payloads[1:]}


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
