"""`receiver init` writes a working config with a fresh secret; `sign --curl` and `replay` take
the secret and the URL from it."""

from __future__ import annotations

import asyncio
import os
import re
import stat
import tomllib

import pytest

from receiver.app import Runtime
from receiver.cli import main
from receiver.config.load import load_settings
from receiver.config.render import render_config
from tests.support.cli import run_cli
from tests.support.helpers import ROOT, free_port
from tests.support.services import require_tool


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_init_writes_a_private_working_config_and_keeps_an_existing_one(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RECEIVER_CONFIG", raising=False)
    code, out, err = cli(capsys, "init")
    assert code == 0, err
    config = tmp_path / "config.toml"
    assert out.startswith("wrote config.toml")
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    first = load_settings(config, env={}).webhook.secrets
    code, out, err = cli(capsys, "check-config")
    assert code == 0 and "OK" in out, err

    code, out, err = cli(capsys, "init")
    assert code == 1 and out == ""
    assert err == (
        "receiver: config.toml already exists; keep it, or pass --force to replace it "
        "(with a new secret)\n"
    )
    assert load_settings(config, env={}).webhook.secrets == first

    config.chmod(0o644)
    code, _, err = cli(capsys, "init", "--force", "--config", str(config))
    assert code == 0, err
    assert load_settings(config, env={}).webhook.secrets != first
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    code, out, err = cli(capsys, "init", "--config", "etc/receiver.toml")
    assert code == 0, err
    assert "check-config --config etc/receiver.toml" in out
    assert (tmp_path / "etc" / "receiver.toml").is_file()


@pytest.fixture
async def receiver_from_init(tmp_path, aiohttp_server):
    """The config `receiver init` writes (port changed to a free one) and a receiver on it."""
    config = tmp_path / "config.toml"
    port = free_port()
    config.write_text(render_config().replace("port = 8080", f"port = {port}"))
    settings = load_settings(config, env={})
    os.chdir(tmp_path)  # the config's SQLite path is relative, as in a user's directory
    try:
        async with Runtime(settings, role="intake") as runtime:
            await aiohttp_server(runtime.public_app(), port=port)
            yield runtime, config
    finally:
        os.chdir(ROOT)


async def test_sign_curl_prints_a_command_that_delivers(receiver_from_init, tmp_path) -> None:
    runtime, config = receiver_from_init
    bash = require_tool("bash")
    require_tool("curl", installed_by="make deploy-tools")
    payload = ROOT / "examples" / "job-failed.json"
    code, command, err = await run_cli("sign", "--curl", str(payload), cwd=tmp_path)
    assert code == 0, err
    port = tomllib.loads(config.read_text())["server"]["port"]
    assert command.startswith(f"curl -sS --fail-with-body -X POST http://127.0.0.1:{port}/webhooks")
    proc = await asyncio.create_subprocess_exec(
        bash, "-c", command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err_bytes = await proc.communicate()
    assert proc.returncode == 0, out + err_bytes
    assert out.decode().rstrip().endswith(" 202") or re.search(rb" 20\d$", out.strip())
    assert await runtime.store.get("4a2dac6e-5f7b-4d9e-9a3c-6b8f0e2a4c55") is not None

    # An explicit URL wins; a wrong secret is refused, and curl then fails.
    code, command, _ = await run_cli(
        "sign",
        "--secret",
        "whsec_wrong",
        "--curl",
        f"http://127.0.0.1:{port}/webhooks",
        str(payload),
        cwd=tmp_path,
    )
    proc = await asyncio.create_subprocess_exec(
        bash, "-c", command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode != 0 and b"invalid_signature" in out


async def test_replay_takes_the_url_and_secret_from_the_config(
    receiver_from_init, tmp_path
) -> None:
    runtime, _config = receiver_from_init
    code, out, err = await run_cli("replay", str(ROOT / "examples"), cwd=tmp_path)
    assert code == 0, out + err
    assert out.strip().splitlines()[-1] == "5 sent, 5 accepted, 0 refused"
    assert len(await runtime.store.list()) == 5


def test_without_a_secret_or_a_config_the_error_says_so(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RECEIVER_CONFIG", raising=False)
    code, out, err = cli(capsys, "sign", str(ROOT / "examples" / "job-failed.json"))
    assert (code, out) == (1, "")
    assert err == "receiver: no --secret given and no config at config.toml to take it from\n"
    code, _, err = cli(capsys, "replay", "--from-store", "x", "--config", "c.toml")
    assert code == 1 and "--from-store needs --url and --secret" in err
