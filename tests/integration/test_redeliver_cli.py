"""``receiver redeliver cancel ID`` says what the cancel did: how many deliveries it withdrew
(put back as they were before the batch) and how many sends in flight may still complete;
``redeliver status`` shows the same afterwards."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest

from receiver.cli import main
from receiver.config.settings import StoreSettings
from receiver.store import Store, open_store
from receiver.store.lanes_model import LanePolicy
from receiver.store.records import NewEvent, Outcome, Snapshot
from tests.support.helpers import write_config

SECRET = "whsec_redeliver_cli"


def run_store(db: Path, work) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        store = open_store(StoreSettings(url=f"sqlite:///{db}"))
        await store.open()
        try:
            await work(store)
        finally:
            await store.close()

    asyncio.run(run())


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def inbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config and its inbox: four events whose ``files`` delivery is dead."""
    write_config(
        tmp_path / "config.toml",
        {
            "webhook": {"secrets": [SECRET]},
            "store": {"url": "sqlite:///inbox.db"},
            "sinks": [{"name": "files", "type": "download"}],
        },
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RECEIVER_CONFIG", raising=False)
    db = tmp_path / "inbox.db"

    async def fill(store: Store) -> None:
        now = time.time()
        for n in range(4):
            await store.add_event(
                NewEvent(f"evt-{n}", "job.completed", f"job-{n}", b"{}", {}, now, ("files",))
            )
            await store.settle(f"evt-{n}", "files", Outcome("dead", "HTTP 503"), now=now)

    run_store(db, fill)
    return db


def test_cancel_says_what_it_withdrew_and_what_is_in_flight(inbox: Path, capsys) -> None:
    code, out, err = cli(capsys, "redeliver", "--detach")
    assert code == 0, err
    match = re.match(r"batch (\w+): 4 deliveries matched", out)
    assert match, out
    batch = match.group(1)

    async def send_one(store: Store) -> None:  # a lane of the running receiver takes one
        now = time.time()
        for n in range(4):
            await store.save_snapshot(f"evt-{n}", Snapshot({}, (), now), now=now)
        claim = await store.claim_deliveries(
            LanePolicy(sink="files"), owner="lane", limit=1, lease_seconds=60, now=now
        )
        assert len(claim.deliveries) == 1

    run_store(inbox, send_one)
    code, out, err = cli(capsys, "redeliver", "cancel", batch)
    assert code == 0, err
    assert out == (
        f"batch {batch}: cancelled; 3 deliveries withdrawn, 1 in flight may still complete\n"
    )
    code, out, _ = cli(capsys, "redeliver", "status", batch, "--json")
    shown = json.loads(out)
    assert (shown["state"], shown["withdrawn"], shown["pending"]) == ("cancelled", 3, 1)
    code, out, _ = cli(capsys, "redeliver", "status", batch)
    assert "; 3 withdrawn (put back as they were before the batch)" in out
    code, out, _ = cli(capsys, "events", "list", "--status", "dead")
    assert out.count("evt-") == 3
