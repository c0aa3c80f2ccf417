"""``receiver webhooks register/list/delete`` against the simulator, and a secret rotation."""

from __future__ import annotations

import asyncio
import json
import signal
import stat
import uuid

import pytest

from receiver.simulator import Simulator
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import ReceiverProcess, free_port, post_webhook, wait_for, write_config
from tests.support.upstream import serve_upstream

API_KEY = "service_" + "ef" * 32
OLD_SECRET = "whsec_before_rotation"


@pytest.fixture
async def upstream(aiohttp_server) -> Simulator:
    return await serve_upstream(aiohttp_server, api_key=API_KEY, seed=31)


def config(tmp_path, sim: Simulator | None, *, secrets_file=True, api_key=API_KEY, **extra):
    data = {
        "webhook": {"secrets": [OLD_SECRET]},
        "api": {
            "base_url": sim.base_url if sim else f"http://127.0.0.1:{free_port()}/v1",
            "api_key": api_key,
            "timeout_seconds": 5,
        },
        "store": {"url": "sqlite:///inbox.db"},
        **extra,
    }
    if secrets_file:
        data["webhook"]["secrets_file"] = str(tmp_path / "secrets" / "webhook-secrets")
    return str(write_config(tmp_path / "receiver.toml", data))


async def webhooks(*args, env=None):
    return await run_cli("webhooks", *args, env={"RECEIVER_API_KEY": "", **(env or {})})


async def test_register_list_delete(tmp_path, upstream) -> None:
    sim = upstream
    cfg = config(tmp_path, sim)
    secrets_file = tmp_path / "secrets" / "webhook-secrets"

    code, out, err = await webhooks(
        "register", "--url", "https://hooks.example/webhooks", "--config", cfg
    )
    assert code == 0, err
    (first,) = sim.webhooks.values()
    assert f"registered webhook {first.id}" in out
    assert str(secrets_file) in out and "kill -HUP" in out
    assert first.secret not in out + err  # shown only with --show-secret
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    assert secrets_file.read_text() == first.secret + "\n"

    # A second registration (a rotation) appends; the first secret stays valid.
    code, out, err = await webhooks(
        "register",
        "--url",
        "https://hooks.example/webhooks",
        "--events",
        "job.failed",
        "--show-secret",
        "--config",
        cfg,
    )
    assert code == 0, err
    second = next(h for h in sim.webhooks.values() if h.id != first.id)
    assert second.events == ["job.failed"]
    assert f"secret: {second.secret}" in out
    assert f"note: {first.id} also deliver(s) to this URL" in out
    assert secrets_file.read_text().splitlines() == [first.secret, second.secret]
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600

    code, out, err = await webhooks("list", "--config", cfg)
    assert code == 0, err
    header, *rows = out.strip().splitlines()
    assert header.split() == ["ID", "ACTIVE", "FAILURES", "EVENTS", "URL"]
    assert [row.split() for row in rows] == [
        [first.id, "yes", "0", "job.completed,job.failed", "https://hooks.example/webhooks"],
        [second.id, "yes", "0", "job.failed", "https://hooks.example/webhooks"],
    ]
    sim.webhooks[first.id].active = False
    sim.webhooks[first.id].consecutive_failures = 100
    code, out, _ = await webhooks("list", "--json", "--config", cfg)
    listed = json.loads(out)
    assert [(h["id"], h["active"], h["consecutive_failures"]) for h in listed] == [
        (first.id, False, 100),
        (second.id, True, 0),
    ]
    assert all("secret" not in h for h in listed)

    code, out, err = await webhooks("delete", first.id, "--config", cfg)
    assert code == 0 and out.strip() == f"deleted webhook {first.id}", err
    assert list(sim.webhooks) == [second.id]
    code, _, err = await webhooks("delete", first.id, "--config", cfg)
    assert code == 1 and first.id in err and "webhooks list" in err
    assert_one_clean_line(err)
    assert len(err.strip().splitlines()) == 1


async def test_register_without_a_secrets_file(tmp_path, upstream) -> None:
    sim = upstream
    cfg = config(tmp_path, sim, secrets_file=False)
    code, out, err = await webhooks("register", "--url", "https://h.example/w", "--config", cfg)
    assert code == 2 and out == ""
    assert "webhook.secrets_file" in err and "--show-secret" in err
    assert len(err.strip().splitlines()) == 1
    assert_one_clean_line(err)
    assert sim.webhooks == {}  # nothing created whose secret would be lost

    code, out, err = await webhooks(
        "register", "--url", "https://h.example/w", "--show-secret", "--config", cfg
    )
    assert code == 0, err
    (hook,) = sim.webhooks.values()
    assert f"secret: {hook.secret}" in out
    assert "appended" not in out


@pytest.mark.parametrize(
    "case,needle,exit_code",
    [
        ("no key", "api.api_key", 2),
        ("wrong key", "401", 1),
        ("unreachable", "api.base_url", 1),
        ("unwritable secrets file", "cannot be written", 1),
        ("not a url", "--url", 1),
        ("refused by the upstream", "validation_failed", 1),
    ],
)
async def test_every_mistake_is_one_line(tmp_path, upstream, case, needle, exit_code) -> None:
    sim = upstream
    url = "https://h.example/w"
    cfg = config(tmp_path, sim)
    if case == "no key":
        cfg = config(tmp_path, sim, api_key="")
    elif case == "wrong key":
        cfg = config(tmp_path, sim, api_key="service_" + "00" * 32)
    elif case == "unreachable":
        cfg = config(tmp_path, None)
    elif case == "unwritable secrets file":
        (tmp_path / "secrets").write_text("a file where a folder should be")
    elif case == "not a url":
        url = "hooks.example/w"
    elif case == "refused by the upstream":
        url = "http://public.example/w"  # the upstream wants https
    code, out, err = await webhooks("register", "--url", url, "--config", cfg)
    assert code == exit_code, (out, err)
    assert needle in err
    assert_one_clean_line(err)
    assert len(err.strip().splitlines()) == 1
    assert sim.webhooks == {}
    if case in ("no key", "wrong key", "unreachable"):
        code, _, err = await webhooks("list", "--config", cfg)
        assert code == exit_code and needle in err
        assert len(err.strip().splitlines()) == 1


async def test_rotation_with_sighup_needs_no_restart(tmp_path, upstream) -> None:
    sim = upstream
    public = free_port()
    cfg = config(
        tmp_path,
        sim,
        server={"host": "127.0.0.1", "port": public},
        admin={"port": free_port()},
    )
    receiver = ReceiverProcess(tmp_path / "receiver.toml", role="intake")
    receiver.start()
    try:
        await receiver.wait_ready()
        url = f"http://127.0.0.1:{public}/webhooks"

        code, _, err = await webhooks("register", "--url", url, "--config", cfg)
        assert code == 0, err
        (hook,) = sim.webhooks.values()
        new_secret = hook.secret
        assert (tmp_path / "secrets" / "webhook-secrets").read_text().split() == [new_secret]

        def event() -> dict:
            return {
                "id": str(uuid.uuid4()),
                "object": "event",
                "event": "job.completed",
                "job_id": str(uuid.uuid4()),
            }

        # Before the reload the running receiver does not know the new secret.
        assert await post_webhook(url, new_secret, event()) == 401
        assert await post_webhook(url, OLD_SECRET, event()) == 200

        assert receiver.proc is not None
        receiver.proc.send_signal(signal.SIGHUP)

        async def new_secret_accepted() -> bool:
            return await post_webhook(url, new_secret, event()) == 200

        await wait_for(new_secret_accepted, what="the new secret after SIGHUP")
        assert await post_webhook(url, OLD_SECRET, event()) == 200  # the old one still works
        assert receiver.proc.poll() is None
        assert "webhook secrets reloaded" in receiver.log()
        assert new_secret not in receiver.log()
    finally:
        receiver.stop()


async def test_a_secrets_file_others_can_read_is_pointed_out(tmp_path, upstream) -> None:
    cfg = config(tmp_path, upstream)
    secrets_file = tmp_path / "secrets" / "webhook-secrets"
    secrets_file.parent.mkdir()
    secrets_file.write_text("whsec_older\n")
    secrets_file.chmod(0o644)
    code, _, err = await webhooks("register", "--url", "https://h.example/w", "--config", cfg)
    assert code == 0
    assert err.strip() == (
        f"receiver: warning: {secrets_file} is readable by others; chmod 600 {secrets_file}"
    )
    (hook,) = upstream.webhooks.values()
    assert secrets_file.read_text().splitlines() == ["whsec_older", hook.secret]


async def test_register_waits_out_a_429_but_never_repeats_after_a_5xx(tmp_path, upstream) -> None:
    from receiver.config.load import load_settings
    from receiver.errors import ReceiverError
    from receiver.upstream import subscriptions

    sim = upstream
    settings = load_settings(config(tmp_path, sim), env={})
    sim.rate_limit_fraction = 1.0
    sim.retry_after = 1
    task = asyncio.ensure_future(subscriptions.register(settings, "https://h.example/w", None))

    async def refused_once() -> bool:
        return sum(n for (_, status), n in sim.responses.items() if status == 429) >= 1

    await wait_for(refused_once, what="a 429")
    sim.rate_limit_fraction = 0.0  # the retry, a second after the 429, goes through
    done = await asyncio.wait_for(task, 20)
    (hook,) = sim.webhooks.values()
    assert done.webhook["id"] == hook.id and done.secret == hook.secret

    sim.error_fraction = 1.0
    before = sim.requests["POST /v1/webhooks"]
    with pytest.raises(ReceiverError, match="may have been created anyway"):
        await subscriptions.register(settings, "https://h.example/w", None)
    assert sim.requests["POST /v1/webhooks"] == before + 1  # the secret may be lost: no retry


async def test_register_that_gets_no_answer_says_a_subscription_may_exist(
    tmp_path, upstream
) -> None:
    """The spec: a timeout does not cancel a write. A registration the upstream does not
    answer in time is not repeated either, and the one line says what to check."""
    upstream.latency_seconds = 2.0
    api = {"base_url": upstream.base_url, "api_key": API_KEY, "timeout_seconds": 0.5}
    cfg = config(tmp_path, upstream, api=api)
    code, out, err = await webhooks("register", "--url", "https://h.example/w", "--config", cfg)
    assert (code, out) == (1, ""), err
    (line,) = err.strip().splitlines()
    assert "did not answer within 0.5s" in line and "may have been created anyway" in line
    assert "webhooks list" in line
    assert upstream.requests["POST /v1/webhooks"] == 1
