"""``python -m tests.package --dist DIR --work DIR``: exit 0 when every check holds.

- DIR holds one sdist and one wheel, both of this release (``receiver.__version__``).
- The sdist holds pyproject.toml, the README, the CHANGELOG and every file of the package,
  so the wheel ``python -m build`` made from it is the whole receiver.
- The wheel holds every file of ``receiver/`` the code needs at run time (the modules, the inbox
  page's templates and static files, any other data file), and nothing else of the project.
- Installed with its dependencies into a fresh virtualenv and run from an empty directory:
  ``receiver --version`` prints ``receiver X.Y.Z (schema N)`` for this release and schema;
  ``receiver init`` writes a config and ``receiver migrate`` creates its SQLite inbox at that
  schema version; the inbox page's templates render from the installed package, and the
  upstream's baseline OpenAPI document loads from it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

from receiver import __version__
from receiver.store.schema_version import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "receiver"
# The receiver's own variables are left out of the runs, so a developer's shell changes nothing.
CLEAN_ENV = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(("RECEIVER_", "PYTHON")) and k != "VIRTUAL_ENV"
}


class CheckFailed(Exception):
    """One promise of the packages not kept."""


def check(condition: object, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def say(line: str) -> None:
    print(f"package: {line}", flush=True)


def package_files() -> set[str]:
    """Every file of receiver/ as the archives name it (no caches)."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def one(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    check(len(found) == 1, f"{dist}: {len(found)} files match {pattern}, want 1: {found}")
    return found[0]


def check_sdist(sdist: Path) -> str:
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    top = f"receiver-{__version__}/"
    check(all(n == top.rstrip("/") or n.startswith(top) for n in names), f"{sdist}: not in {top}")
    held = {n.removeprefix(top) for n in names}
    wanted = {"pyproject.toml", "README.md", "CHANGELOG.md", "PKG-INFO"} | package_files()
    missing = sorted(wanted - held)
    check(not missing, f"{sdist.name} lacks {missing[:5]}")
    return f"{sdist.name}: {len(held)} files, README, CHANGELOG and all of receiver/"


def check_wheel(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    info = f"receiver-{__version__}.dist-info/"
    check(f"{info}METADATA" in names, f"{wheel.name}: no {info}METADATA")
    missing = sorted(package_files() - names)
    check(not missing, f"{wheel.name} lacks {missing[:5]} (package data not declared?)")
    stray = sorted(n for n in names if not n.startswith(("receiver/", info)))
    check(not stray, f"{wheel.name} holds files outside the package: {stray[:5]}")
    data = [n for n in names if n.startswith("receiver/") and not n.endswith(".py")]
    return f"{wheel.name}: {len(names)} files, {len(data)} of them data (templates, static)"


def run(argv: list[str], cwd: Path, timeout: float = 120) -> str:
    """Run a command of the fresh virtualenv; its output, or CheckFailed naming it."""
    done = subprocess.run(
        argv, cwd=cwd, env=CLEAN_ENV, capture_output=True, text=True, timeout=timeout, check=False
    )
    shown = " ".join(Path(argv[0]).name if i == 0 else a for i, a in enumerate(argv))
    check(done.returncode == 0, f"`{shown}` exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout.strip()


def install(wheel: Path, venv: Path, python: str) -> Path:
    """The wheel and its dependencies (from the package index) in a new virtualenv."""
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    bin_dir = venv / "bin"
    started = time.monotonic()
    subprocess.run(
        [str(bin_dir / "pip"), "install", "--quiet", "--disable-pip-version-check", str(wheel)],
        env=CLEAN_ENV,
        check=True,
    )
    say(f"installed {wheel.name} and its dependencies in {time.monotonic() - started:.0f} s")
    return bin_dir


def check_installed(bin_dir: Path, here: Path) -> list[str]:
    """Run the installed receiver from ``here``, an empty directory of its own."""
    where = run([str(bin_dir / "python"), "-c", "import receiver; print(receiver.__file__)"], here)
    check(Path(where).is_relative_to(bin_dir.parent), f"receiver imported from {where}")
    version = run([str(bin_dir / "receiver"), "--version"], here)
    want = f"receiver {__version__} (schema {SCHEMA_VERSION})"
    check(version == want, f"receiver --version printed {version!r}, not {want!r}")
    run([str(bin_dir / "receiver"), "init"], here)
    migrated = run([str(bin_dir / "receiver"), "migrate", "--config", "config.toml"], here)
    check(str(SCHEMA_VERSION) in migrated, f"receiver migrate printed {migrated!r}")
    inbox = here / "data" / "receiver.db"
    check(inbox.is_file(), f"receiver migrate made no {inbox}")
    with sqlite3.connect(f"file:{inbox}?mode=ro", uri=True) as conn:
        (user_version,) = conn.execute("PRAGMA user_version").fetchone()
    conn.close()
    check(user_version == SCHEMA_VERSION, f"the new inbox is at schema {user_version}")
    render = (
        "from receiver.web import render, ui\n"
        "assert (ui.STATIC / 'ui.css').is_file() and (ui.STATIC / 'ui.js').is_file()\n"
        "names = render.ENVIRONMENT.list_templates()\n"
        "[render.ENVIRONMENT.get_template(t) for t in names]\n"
        "print(len(names))\n"
    )
    templates = run([str(bin_dir / "python"), "-c", render], here)
    spec = "from receiver.upstream.spec_source import baseline\nprint(baseline().revision)\n"
    revision = run([str(bin_dir / "python"), "-c", spec], here)
    return [
        f"`receiver --version`: {version}",
        f"`receiver init` and `receiver migrate`: {migrated}",
        f"{templates} templates of the inbox page load from the installed package",
        f"the upstream's baseline OpenAPI document (revision {revision}) loads from it",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.package", description=__doc__)
    parser.add_argument("--dist", type=Path, default=ROOT / "dist")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "package-check")
    parser.add_argument("--python", default=sys.executable, help="makes the fresh virtualenv")
    args = parser.parse_args(argv)
    args.work = args.work.resolve()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    try:
        say(check_sdist(one(args.dist, f"receiver-{__version__}.tar.gz")))
        wheel = one(args.dist, f"receiver-{__version__}-py3-none-any.whl")
        say(check_wheel(wheel))
        bin_dir = install(wheel.resolve(), args.work / "venv", args.python)
        here = Path(tempfile.mkdtemp(prefix="run-", dir=args.work))
        for line in check_installed(bin_dir, here):
            say(line)
    except (CheckFailed, subprocess.CalledProcessError) as exc:
        say(f"FAILED: {exc}")
        return 1
    shutil.rmtree(args.work, ignore_errors=True)
    say("every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
