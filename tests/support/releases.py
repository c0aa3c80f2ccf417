"""Earlier releases of the receiver, installed in virtualenvs of their own, for upgrade tests.

:func:`release_venv` gives the ``bin`` directory of a virtualenv holding the wheel of that
release from ``tests/data/releases`` (see its README) with its Postgres extra. The virtualenv is
made once per wheel and kept outside the checkout, under
``$XDG_CACHE_HOME/receiver-tests/releases/<version>-<wheel sha256, 12 characters>`` (``~/.cache``
when unset): the first run downloads the release's dependencies from the package index (pinned
to the versions this checkout's environment runs, so both releases use the same libraries) and
takes a minute at most; later runs and the other pytest workers reuse it at once. It is built in
a temporary directory and renamed into place, under a file lock, so a run interrupted halfway
leaves nothing half made and concurrent workers build it once.

When pip cannot reach the package index the test is skipped, saying so, unless
``RECEIVER_REQUIRE_SERVICES=1`` (as in CI), where it fails.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

from tests.support.helpers import ROOT
from tests.support.services import _missing

RELEASES = ROOT / "tests" / "data" / "releases"
EXTRA = "postgres"

# What pip prints when the package index cannot be reached (no network, no DNS, a proxy down).
UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
    r"resolution|Name or service not known|Network is unreachable|Connection refused|"
    r"ConnectTimeoutError|ReadTimeoutError|ProxyError"
)


def release_wheel(version: str) -> Path:
    """The committed wheel of ``version``."""
    wheel = RELEASES / f"receiver-{version}-py3-none-any.whl"
    if not wheel.is_file():
        raise AssertionError(f"no wheel of receiver {version} in {RELEASES} (see its README.md)")
    return wheel


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "receiver-tests" / "releases"


def release_venv(version: str) -> Path:
    """The ``bin`` directory of a virtualenv running receiver ``version`` (with asyncpg).

    Its ``python -m receiver`` and ``receiver`` are that release.
    """
    wheel = release_wheel(version)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()[:12]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    name = f"{version}-{digest}"
    target = root / name
    if (target / "bin" / "receiver").exists():
        return target / "bin"
    with (root / f"{name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be building it: wait for it
        if not (target / "bin" / "receiver").exists():
            _build(wheel, root, name)
    return target / "bin"


def _build(wheel: Path, root: Path, name: str) -> None:
    for stale in root.glob(f".{name}-*"):  # an earlier build interrupted halfway
        shutil.rmtree(stale, ignore_errors=True)
    building = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    target = root / name
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", str(building)], check=True, capture_output=True
        )
        constraints = building / "constraints.txt"
        constraints.write_text("".join(f"{pin}\n" for pin in _pins(wheel)))
        pip = [
            str(building / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--retries",
            "2",
            "--timeout",
            "20",
            "--constraint",
            str(constraints),
            f"{wheel}[{EXTRA}]",
        ]
        result = subprocess.run(pip, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            output = result.stdout + result.stderr
            unreachable = _unreachable(output)
            if unreachable:
                _missing(
                    f"pip could not reach the package index to install the dependencies of "
                    f"{wheel.name} into {target}: {unreachable}"
                )
            raise AssertionError(f"pip could not install {wheel.name}:\n{output}")
        _relocate(building, target)
        building.rename(target)  # atomic: the virtualenv appears whole or not at all
    finally:
        if building.exists():
            shutil.rmtree(building, ignore_errors=True)


def _pins(wheel: Path) -> list[str]:
    """``name==version`` for each of the wheel's dependencies (its Postgres extra included)
    that this environment has installed."""
    with zipfile.ZipFile(wheel) as archive:
        info = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        requires = Parser().parsestr(archive.read(info).decode()).get_all("Requires-Dist") or []
    pins = []
    for requirement in requires:
        spec, _, marker = requirement.partition(";")
        if marker and f'extra == "{EXTRA}"' not in marker:
            continue
        dist = re.match(r"[A-Za-z0-9._-]+", spec.strip())
        if dist is None:
            continue
        try:
            pins.append(f"{dist.group(0)}=={metadata.version(dist.group(0))}")
        except metadata.PackageNotFoundError:
            continue
    return pins


def _relocate(building: Path, target: Path) -> None:
    """Point the scripts in ``bin`` (their ``#!`` lines, ``activate``) at where the virtualenv
    is about to be renamed to."""
    old, new = str(building).encode(), str(target).encode()
    for script in (building / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        if old in data:
            script.write_bytes(data.replace(old, new))


def _unreachable(output: str) -> str:
    """The first line of pip's output that says the package index could not be reached."""
    return next((line.strip() for line in output.splitlines() if UNREACHABLE.search(line)), "")
