"""What the image holds and declares, read from its metadata and its mounted filesystem.

Promises: a non-root user; an exec-form entrypoint ``receiver``; a HEALTHCHECK; the OCI labels
naming this release and the commit it was built from; no secrets in its environment, config or
package configuration; none of the project's tests or sources; no pip or apt caches; no
compilers or build tools.
"""

from __future__ import annotations

import contextlib
import re
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from receiver import __version__
from tests.image.container import check, command
from tests.support.helpers import ROOT

SECRET_VARIABLES = (
    "RECEIVER_WEBHOOK_SECRETS",
    "RECEIVER_API_KEY",
    "RECEIVER_ADMIN_TOKEN",
    "RECEIVER_STORE_URL",
)
BUILD_TOOLS = ("gcc", "cc", "c++", "g++", "make", "ld", "as", "git")
CREDENTIAL_URL = re.compile(r"://[^/\s:@]+:[^/\s@]+@")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def pinned_versions() -> dict[str, str]:
    """deploy/docker/constraints.txt as {normalised name: version}."""
    text = (ROOT / "deploy" / "docker" / "constraints.txt").read_text()
    pairs = (line.split("==") for line in text.splitlines() if "==" in line)
    return {_normal(name): version.strip() for name, version in pairs}


def declared(meta: dict[str, Any]) -> list[str]:
    """Check the image's metadata; one line per promise kept."""
    config = meta["Config"]
    user = str(config.get("User") or "")
    check(user and user.split(":")[0] not in ("0", "root"), f"the image runs as {user or 'root'}")
    check(config.get("Entrypoint") == ["receiver"], f"entrypoint {config.get('Entrypoint')}")
    check(config.get("Cmd") == ["serve"], f"cmd {config.get('Cmd')}")
    check(config.get("StopSignal") == "SIGTERM", f"stop signal {config.get('StopSignal')}")
    test = (meta.get("Healthcheck") or {}).get("Test") or []
    check(test[:1] == ["CMD"], f"HEALTHCHECK {test or 'missing'} (build with --format docker)")
    env = dict(item.split("=", 1) for item in config.get("Env") or ())
    leaked = [name for name in SECRET_VARIABLES if env.get(name)]
    check(not leaked, f"the image's environment sets {leaked}")
    return [
        f"user {user}, entrypoint {config['Entrypoint']} {config['Cmd']}, HEALTHCHECK {test[1:]}",
        "no secret in the image's environment",
    ]


OCI = "org.opencontainers.image."


def labelled(meta: dict[str, Any], revision: str | None) -> list[str]:
    """Check the image's OCI labels: this release, the commit ``make image`` passed (any commit
    when ``revision`` is None), a source and a title."""
    labels = meta["Config"].get("Labels") or {}
    version = labels.get(OCI + "version")
    check(version == __version__, f"label {OCI}version {version!r}, not {__version__!r}")
    built_from = labels.get(OCI + "revision")
    if revision is None:
        check(built_from and built_from != "unknown", f"label {OCI}revision {built_from!r}")
    else:
        check(built_from == revision, f"label {OCI}revision {built_from!r}, not {revision!r}")
    for name in ("source", "title", "description"):
        check(labels.get(OCI + name), f"no label {OCI}{name}")
    return [f"labels: version {version}, revision {built_from}, source {labels[OCI + 'source']}"]


@contextlib.asynccontextmanager
async def mounted(container: str) -> AsyncIterator[Path]:
    """The working container's root filesystem, mounted on the host."""
    status, out = await command("buildah", "mount", container)
    check(status == 0, f"buildah mount: {out.strip()}")
    try:
        yield Path(out.strip().splitlines()[-1])
    finally:
        await command("buildah", "umount", container)


def contents(root: Path) -> list[str]:
    """Check the image's files; one line per promise kept."""
    venv = root / "opt" / "receiver"
    check((venv / "bin" / "receiver").exists(), "no /opt/receiver/bin/receiver")
    check(not (root / "src").exists(), "the build stage's /src is in the image")
    packaged = list(venv.glob("lib/python3*/site-packages/receiver"))
    check(packaged, "the receiver package is not installed in /opt/receiver")
    project_files = [p for p in venv.rglob("conftest.py")] + [
        p for p in packaged[0].rglob("*") if p.name in ("tests", "bench")
    ]
    check(not project_files, f"test files in the image: {project_files[:3]}")
    caches = [p for p in (root / "root" / ".cache", root / "data" / ".cache") if p.exists()]
    caches += list((root / "var" / "cache" / "apt" / "archives").glob("*.deb"))
    caches += [
        p
        for p in (root / "var" / "lib" / "apt" / "lists").glob("*")
        if p.is_file() and p.name != "lock"
    ]
    check(not caches, f"caches in the image: {[str(p.relative_to(root)) for p in caches[:3]]}")
    pinned = pinned_versions()
    site = packaged[0].parent
    stems = (d.name.removesuffix(".dist-info").rsplit("-", 1) for d in site.glob("*.dist-info"))
    installed = {_normal(name): version for name, version in stems}
    installed.pop("receiver", None)
    unpinned = {n: v for n, v in installed.items() if pinned.get(n) != v}
    check(installed and not unpinned, f"installed but not as pinned: {unpinned}")
    leftovers = [p.name for p in site.iterdir() if p.name in ("pip", "setuptools", "pkg_resources")]
    check(not leftovers, f"build tools in the image's virtualenv: {leftovers}")
    tools = [
        f"{d}/{t}"
        for d in ("usr/bin", "usr/local/bin", "opt/receiver/bin")
        for t in BUILD_TOOLS
        if (root / d / t).exists()
    ]
    check(not tools, f"build tools in the image: {tools}")
    config = tomllib.loads((root / "etc" / "receiver" / "config.toml").read_text())
    check(not config.get("webhook", {}).get("secrets"), "the image's config holds webhook secrets")
    check(not config.get("api", {}).get("api_key"), "the image's config holds an API key")
    check(not config.get("admin", {}).get("token"), "the image's config holds an admin token")
    for name in ("etc/pip.conf", "etc/apt/auth.conf", "root/.netrc", "root/.pypirc"):
        path = root / name
        text = path.read_text(errors="replace") if path.exists() else ""
        check(not CREDENTIAL_URL.search(text), f"a URL with credentials in /{name}")
        check(not text or name == "etc/pip.conf", f"/{name} is in the image")
    return [
        f"{len(installed)} packages, each at its version in deploy/docker/constraints.txt",
        "holds the virtualenv and config only: no /src, no tests, no pip/apt caches",
        f"no pip or setuptools in the virtualenv, no {', '.join(BUILD_TOOLS)}",
        "no secrets in its config or package settings",
    ]
