"""deploy/docker/Dockerfile: hadolint, what the image promises, and its HEALTHCHECK for real.

The image itself is built and run by `make image-test` (tests/image, run by CI, not part of
this suite); `make image-smoke` repeats the Dockerfile's install steps in a throwaway virtualenv.
"""

import fnmatch
import json
import os
import re
import subprocess
import sys
import tomllib

import pytest

from tests.deploy.support import DEPLOY, run_tool
from tests.support.helpers import ROOT, ReceiverProcess, free_port, write_config
from tests.support.services import require_tool

DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
IMAGE_CONFIG = DEPLOY / "docker" / "config.toml"


def instructions():
    """(INSTRUCTION, arguments) for each instruction, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), " ".join(rest.split())))
    return found


def arguments(keyword):
    return [rest for key, rest in instructions() if key == keyword]


def image_config():
    return tomllib.loads(IMAGE_CONFIG.read_text())


def test_hadolint_finds_nothing():
    hadolint = require_tool("hadolint")
    assert run_tool([hadolint, "--no-color", str(DOCKERFILE)]) == ""


def test_multi_stage_slim_non_root_with_a_data_volume():
    froms = arguments("FROM")
    assert len(froms) >= 2
    assert froms[0].endswith(" AS build")
    base = re.search(r"ARG PYTHON_IMAGE=(\S+)", DOCKERFILE.read_text())
    assert base and "-slim" in base.group(1)
    assert froms[-1] == "${PYTHON_IMAGE}"
    user = arguments("USER")[-1]
    assert user.split(":")[0] not in ("0", "root")
    assert arguments("VOLUME") == ['["/data"]']
    config = image_config()
    assert config["store"]["url"].startswith("sqlite:////data/")
    assert all(sink["directory"].startswith("/data/") for sink in config["sinks"])
    exposed = {int(port) for port in arguments("EXPOSE")[0].split()}
    assert exposed == {config["server"]["port"], config["admin"]["port"]}
    assert arguments("ENTRYPOINT") == ['["receiver"]']
    assert arguments("CMD") == ['["serve"]']


def test_the_image_config_is_valid(tmp_path):
    env = {**os.environ, "RECEIVER_WEBHOOK_SECRETS": "whsec_from_the_environment"}
    done = subprocess.run(
        [sys.executable, "-m", "receiver", "check-config", "--config", str(IMAGE_CONFIG)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "whsec_from_the_environment" not in done.stdout


def dockerignore_allows(path):
    """Docker's rule: the last matching pattern wins; a parent directory's match counts."""
    allowed = True
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        candidates = prefixes
        if pattern.startswith("**/"):  # at any depth: match the names
            candidates = [prefix.rsplit("/", 1)[-1] for prefix in prefixes]
            pattern = pattern[3:]
        if any(fnmatch.fnmatchcase(c, pattern) for c in candidates):
            allowed = negated
    return allowed


def test_the_build_context_holds_what_the_dockerfile_copies():
    for copy in arguments("COPY"):
        if copy.startswith("--from"):
            continue
        for source in copy.split()[:-1]:
            path = ROOT / source
            assert path.exists(), source
            probe = f"{source}/__init__.py" if path.is_dir() else source
            assert dockerignore_allows(probe), f".dockerignore excludes {probe}"
    for private in (".venv/bin/python", "data/receiver.db", "tests/conftest.py", ".git/HEAD"):
        assert not dockerignore_allows(private), private
    assert not dockerignore_allows("receiver/__pycache__/app.cpython-311.pyc")


@pytest.fixture
async def receiver_on_image_config(tmp_path):
    """A receiver on the image's config, moved to free ports and a temporary /data."""
    config = image_config()
    config["server"]["port"] = free_port()
    config["admin"]["port"] = free_port()
    config["admin"]["host"] = "127.0.0.1"
    config["webhook"]["secrets"] = ["whsec_healthcheck"]
    config["store"]["url"] = f"sqlite:///{tmp_path}/data/receiver.db"
    for sink in config["sinks"]:
        sink["directory"] = str(tmp_path / sink["directory"].lstrip("/"))
    proc = ReceiverProcess(write_config(tmp_path / "config.toml", config))
    proc.start()
    try:
        await proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def healthcheck_command():
    """The HEALTHCHECK's exec form, run with this interpreter's ``receiver``."""
    exec_form = re.search(r"CMD (\[.*\])", arguments("HEALTHCHECK")[0])
    assert exec_form
    command = json.loads(exec_form.group(1))
    assert command[:2] == ["receiver", "healthcheck"]
    return [sys.executable, "-m", "receiver", *command[1:]]


async def test_the_healthcheck_follows_the_configs_admin_port_and_fails_once_stopped(
    receiver_on_image_config,
):
    """The image's config moved to another ops port: the HEALTHCHECK, which reads the config
    $RECEIVER_CONFIG names (as in the image), asks that port."""
    env = {**os.environ, "RECEIVER_CONFIG": str(receiver_on_image_config.config)}
    env["RECEIVER_WEBHOOK_SECRETS"] = "whsec_healthcheck"
    done = subprocess.run(healthcheck_command(), capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout == f"http://127.0.0.1:{receiver_on_image_config.ops_port}/readyz: 200 ready\n"
    )
    assert receiver_on_image_config.terminate() == 0
    done = subprocess.run(healthcheck_command(), capture_output=True, text=True, env=env)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "no answer" in done.stderr
