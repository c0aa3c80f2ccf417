"""One release number and one inbox schema number, and everything that names them agrees.

The release is written once, as ``receiver.__version__`` (the package metadata reads it from
there); the schema version once, in ``receiver.store.schema_version``, which both SQL stores'
migration lists must reach.
"""

from __future__ import annotations

import re
import tomllib
from datetime import date

import pytest

from receiver import __version__
from receiver.cli import build_parser
from receiver.store import postgres, sqlite
from receiver.store.schema_version import SCHEMA_VERSION
from tests.support.helpers import ROOT

SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")
RELEASE_HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?$")


def test_the_release_is_a_semantic_version() -> None:
    assert SEMVER.fullmatch(__version__), __version__


def test_both_stores_migrate_to_the_one_schema_version() -> None:
    assert sqlite.SCHEMA_VERSION == SCHEMA_VERSION
    assert postgres.SCHEMA_VERSION == SCHEMA_VERSION
    # Each list brings the schema up one version at a time, from 1.
    assert len(sqlite.MIGRATIONS) == SCHEMA_VERSION
    assert [m.version for m in postgres.MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))
    for number, statements in enumerate(sqlite.MIGRATIONS, start=1):
        assert statements[-1] == f"PRAGMA user_version = {number}"


def test_version_names_the_release_and_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"receiver {__version__} (schema {SCHEMA_VERSION})\n"


def test_the_package_metadata_reads_the_version_from_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "receiver.__version__"}


def changelog_releases() -> list[tuple[str, str | None]]:
    lines = (ROOT / "CHANGELOG.md").read_text().splitlines()
    return [(m["version"], m["date"]) for line in lines if (m := RELEASE_HEADING.match(line))]


def test_the_changelog_lists_this_release_dated_under_unreleased() -> None:
    releases = changelog_releases()
    assert releases[0] == ("Unreleased", None)
    assert releases[1][0] == __version__, "CHANGELOG.md: no section for this release"
    versions = [tuple(int(n) for n in v.split(".")) for v, _ in releases[1:]]
    assert versions == sorted(versions, reverse=True), "CHANGELOG.md: releases out of order"
    dates = [d for _, d in releases[1:]]
    assert None not in dates, "CHANGELOG.md: a release without its date"
    assert all(date.fromisoformat(d) for d in dates if d)
    assert dates == sorted(dates, reverse=True)
