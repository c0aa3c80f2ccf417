"""``receiver replay``: stored events re-sent elsewhere, and the progress bar on a terminal."""

from __future__ import annotations

import asyncio
import os
import pty
import sys

import pytest

from receiver.app import Runtime
from receiver.config.load import parse_settings
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import ROOT, write_config

SECRET = "whsec_replay"
STAGING_SECRET = "whsec_staging"


async def start_intake(aiohttp_server, db, secret):
    settings = parse_settings(
        {"webhook": {"secrets": [secret]}, "store": {"url": f"sqlite:///{db}"}}, env={}
    )
    runtime = Runtime(settings, role="intake")
    await runtime.__aenter__()
    server = await aiohttp_server(runtime.public_app())
    return runtime, str(server.make_url("/webhooks"))


@pytest.fixture
async def two_receivers(tmp_path, aiohttp_server):
    production = await start_intake(aiohttp_server, tmp_path / "prod.db", SECRET)
    staging = await start_intake(aiohttp_server, tmp_path / "staging.db", STAGING_SECRET)
    config = write_config(
        tmp_path / "prod.toml",
        {"webhook": {"secrets": [SECRET]}, "store": {"url": f"sqlite:///{tmp_path}/prod.db"}},
    )
    yield production, staging, str(config)
    for runtime, _ in (production, staging):
        await runtime.close()


async def test_from_store_resends_the_exact_bytes_freshly_signed(two_receivers) -> None:
    (prod, prod_url), (staging, staging_url), config = two_receivers
    code, out, err = await run_cli("replay", "--url", prod_url, "--secret", SECRET, "examples")
    assert code == 0, out + err
    stored = {e.id: e for e in await prod.store.list(limit=10)}
    chosen = sorted(stored)[:3]

    code, out, err = await run_cli(
        "replay",
        "--url",
        staging_url,
        "--secret",
        STAGING_SECRET,
        "--concurrency",
        "2",
        "--config",
        config,
        "--from-store",
        *chosen,
    )
    assert code == 0, out + err
    lines = out.strip().splitlines()
    assert lines[-1] == "3 sent, 3 accepted, 0 refused"
    for event_id in chosen:
        assert any(
            line.startswith("200  inbox:job.") and line.endswith(event_id) for line in lines
        ), lines
        copy = await staging.store.get(event_id)
        assert copy is not None
        assert copy.body == stored[event_id].body  # the exact bytes once received


async def test_from_store_with_an_unknown_id_sends_nothing(two_receivers) -> None:
    (_, prod_url), (staging, staging_url), config = two_receivers
    await run_cli("replay", "--url", prod_url, "--secret", SECRET, "examples")
    known = (await (two_receivers[0][0]).store.list(limit=1))[0].id
    code, out, err = await run_cli(
        "replay",
        "--url",
        staging_url,
        "--secret",
        STAGING_SECRET,
        "--config",
        config,
        "--from-store",
        known,
        "no-such-event",
    )
    assert code == 1 and out == ""
    assert "no-such-event" in err
    assert_one_clean_line(err)
    assert await staging.store.list() == []


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--from-store", "x", "--", "examples"], "not both"),
        ([], "nothing to send"),
        (["--concurrency", "0", "examples"], "--concurrency"),
    ],
)
async def test_usage_mistakes_are_one_line(args, needle) -> None:
    code, _, err = await run_cli("replay", "--url", "http://127.0.0.1:1/w", "--secret", "s", *args)
    assert code == 1 and needle in err
    assert_one_clean_line(err)
    assert len(err.strip().splitlines()) == 1


async def test_a_terminal_gets_a_progress_bar(two_receivers) -> None:
    (_, url), _, _ = two_receivers
    master, slave = pty.openpty()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "receiver",
        "replay",
        "--url",
        url,
        "--secret",
        SECRET,
        "examples",
        "examples/logo-completed.json",
        stdout=slave,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    os.close(slave)
    chunks = []
    loop = asyncio.get_running_loop()
    while True:
        try:
            chunk = await loop.run_in_executor(None, os.read, master, 4096)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert await proc.wait() == 0
    screen = b"".join(chunks).decode()
    assert "\r\x1b[K[" in screen
    assert "] 6/6  accepted 6  refused 0" in screen
    assert screen.rstrip().endswith("6 sent, 6 accepted, 0 refused")
    assert "200  examples" not in screen  # success lines are counted, not listed
