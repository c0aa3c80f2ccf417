"""``receiver watch`` as a user meets it: with or without a running receiver, and bad ids."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from structlog.testing import capture_logs

from receiver.app import Runtime
from receiver.config.load import parse_settings
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import wait_for, write_config
from tests.support.pull import receiver_config, serve_simulator


@pytest.fixture
async def upstream(aiohttp_server):
    return await serve_simulator(aiohttp_server, seed=31)


def config_data(tmp_path, upstream):
    return receiver_config(tmp_path, upstream, pull={"wait_seconds": 2})


@pytest.mark.parametrize(
    "ids",
    [["not-a-job"], [str(uuid.uuid4()), "../../etc/passwd"], ["1234"]],
)
async def test_an_id_that_is_not_a_uuid_is_one_line_and_changes_nothing(tmp_path, upstream, ids):
    config = write_config(tmp_path / "config.toml", config_data(tmp_path, upstream))
    code, out, err = await run_cli("watch", "--config", str(config), *ids)
    assert (code, out) == (2, "")
    assert_one_clean_line(err)
    assert len(err.strip().splitlines()) == 1 and "is not a job id" in err
    assert not (tmp_path / "inbox.db").exists()  # the inbox was not even opened


async def test_no_id_is_a_usage_error(tmp_path, upstream):
    config = write_config(tmp_path / "config.toml", config_data(tmp_path, upstream))
    code, _out, err = await run_cli("watch", "--config", str(config))
    assert code == 2
    assert_one_clean_line(err)


async def test_watch_before_the_receiver_runs_then_while_it_runs(tmp_path, upstream):
    sim = upstream
    config = write_config(tmp_path / "config.toml", config_data(tmp_path, sim))
    early, late = (sim.add_job("logo", status="processing")["job_id"] for _ in range(2))

    code, out, err = await run_cli("watch", "--config", str(config), early, early.upper())
    assert code == 0, err
    assert out.splitlines() == [f"{early}  watching"]  # the same job, in either case

    with capture_logs():
        async with Runtime(parse_settings(config_data(tmp_path, sim), env={})) as runtime:
            code, out, err = await run_cli("watch", "--config", str(config), late)
            assert code == 0, err
            assert out.strip() == f"{late}  watching"
            await asyncio.sleep(0.2)
            sim.complete_job(early)
            sim.complete_job(late)

            async def both_delivered() -> bool:
                events = await runtime.store.list()
                return len(events) == 2 and all(e.state == "done" for e in events)

            await wait_for(both_delivered, 20, what="both watched jobs delivered")
            watches = {w.job_id: w.state for w in await runtime.store.list_watches()}
            assert watches == {early: "done", late: "done"}

    code, out, err = await run_cli("watch", "--config", str(config), early)
    assert code == 0, err
    assert out.strip() == f"{early}  done (its outcome was already delivered)"
