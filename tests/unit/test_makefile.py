"""`make help` lists every target of the Makefile, each with its description."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# "name: prerequisites  ## description", not "NAME := value" and not ".venv/..." file targets.
_TARGET = re.compile(r"^([a-zA-Z][a-zA-Z0-9_.-]*)\s*:(?!=)")


def targets() -> list[str]:
    return [
        m.group(1)
        for line in (ROOT / "Makefile").read_text().splitlines()
        if (m := _TARGET.match(line))
    ]


def make_help(*args: str) -> str:
    make = shutil.which("make")
    if make is None:
        pytest.fail("make is not installed")
    done = subprocess.run(
        [make, "--no-print-directory", "-C", str(ROOT), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout


def test_make_help_lists_every_target_with_a_description() -> None:
    listed = {}
    for line in make_help("help").splitlines()[1:]:
        name, _, description = line.strip().partition(" ")
        listed[name] = description.strip()
    found = targets()
    assert len(found) > 15 and "install-all" in found and "help" in found
    for name in found:
        assert listed.get(name), f"make help does not describe `{name}` (add `## ...`)"
    assert set(listed) == set(found)


def test_make_alone_shows_the_help() -> None:
    assert make_help() == make_help("help")


def test_every_phony_target_exists() -> None:
    text = (ROOT / "Makefile").read_text()
    phony = {name for line in re.findall(r"^\.PHONY:(.*)$", text, re.M) for name in line.split()}
    assert phony - set(targets()) == set()
