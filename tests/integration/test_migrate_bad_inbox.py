"""An inbox file that is no SQLite inbox (random bytes, a text file) or a truncated one: every
command that reads or opens it (``migrate status``, ``migrate --dry-run``, ``migrate``,
``serve``, ``events list``) ends with one clear line and exit 1, and leaves the file as it was.
Each command runs as its own process, as a user runs it."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import pytest

from receiver.store import sqlite
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import free_port, write_config
from tests.support.old_inbox import make_sqlite_inbox

COMMANDS = [
    ("migrate", "status"),
    ("migrate", "--dry-run"),
    ("migrate",),
    ("serve",),
    ("events", "list"),
]
TEXT = "[store]\nurl = 'sqlite:///data/inbox.db'\n# a config file where the inbox was meant to be\n"


def random_bytes(db: Path) -> None:
    db.write_bytes(random.Random(7).randbytes(64 * 1024))


def text_file(db: Path) -> None:
    db.write_text(TEXT)


def truncated(db: Path) -> None:
    make_sqlite_inbox(db, sqlite.SCHEMA_VERSION, events=3000)
    size = db.stat().st_size
    assert size > 512 * 1024, size
    os.truncate(db, size // 2)


BAD = {"random bytes": random_bytes, "a text file": text_file, "truncated": truncated}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("bad", list(BAD))
async def test_a_file_that_is_no_inbox_is_one_clear_line_and_left_as_it_was(
    tmp_path: Path, bad: str, command: tuple[str, ...]
) -> None:
    db = tmp_path / "inbox.db"
    BAD[bad](db)
    before = digest(db)
    config = write_config(
        tmp_path / "config.toml",
        {
            "server": {"port": free_port()},
            "admin": {"port": free_port()},
            "webhook": {"secrets": ["whsec_bad_inbox"]},
            "store": {"url": f"sqlite:///{db}"},
        },
    )

    code, out, err = await run_cli(*command, "--config", str(config), cwd=tmp_path)
    assert (code, out) == (1, ""), err
    assert_one_clean_line(err)
    assert len(err.strip().splitlines()) == 1
    line = err.strip()
    assert f"the inbox database {db} " in line
    assert "is corrupt or not a SQLite database" in line or (
        "is damaged (" in line  # serve's start-up check, with where to read on
        and "the receiver does not start on it and left it as it was" in line
    ), line
    assert digest(db) == before
    # Nothing of SQLite's own left beside it (the writers' turn file is empty and harmless).
    left = sorted(p.name for p in tmp_path.glob("inbox.db*"))
    assert left in (["inbox.db"], ["inbox.db", "inbox.db-writer"]), left
