"""Make the inbox of every earlier schema version, with that version's own code, for the upgrade
tests (``tests/upgrade/``).

A developer runs this once each time the schema gets a new version (the suite never runs it):
add the commit whose code last had the previous version to :data:`VERSIONS`, then, from the
repository's root::

    .venv/bin/python tests/data/upgrades/make_inboxes.py 8        # only the new entry
    .venv/bin/python tests/data/upgrades/make_inboxes.py          # every version again

and commit what it wrote. It needs git, ``python3 -m venv``, pip with PyPI, PostgreSQL at
``RECEIVER_TEST_POSTGRES_URL`` (default: the local ``test`` database) and ``pg_dump``.

For each version it takes that commit's tree (``git archive``), installs it in a venv of its
own (``pip install 'TREE[postgres]'``; kept under ``--work`` for the next run) and runs that
version's ``receiver serve`` as its own process, configured in that version's format, once on
SQLite and once on a Postgres schema named ``receiver_upgrade_v{N}``. The upstream is this
checkout's simulator, the sinks are HTTP servers of this script (see :mod:`inbox_scenario`
beside it for what is sent and done). Once the receiver has stopped on SIGTERM it writes, under
``tests/data/upgrades/v{N}/``: ``inbox.db`` (checkpointed, no WAL beside it; ``.gz`` when larger
than 300 KB), ``postgres.sql`` (``pg_dump`` of that schema, plain SQL without owners or
privileges; ``.gz`` likewise) and ``manifest.json``, the facts of both inboxes read with SQL
(:func:`tests.support.upgrade_inboxes.inbox_facts`), which the tests compare against.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT), str(HERE)]

from inbox_scenario import Scenario  # noqa: E402
from old_receiver import OldReceiver  # noqa: E402

from tests.support.upgrade_inboxes import (  # noqa: E402
    inbox_facts,
    postgres_tables,
    sqlite_reader,
    sqlite_tables,
)

#: The commit whose code last had each earlier schema version.
VERSIONS: dict[int, str] = {
    1: "adb236e",  # release 0.1.0
    2: "c592284",
    3: "db7c1b8",
    4: "1fd64d0",  # release 0.2.0
    5: "5318c3c",
    6: "3468b8f",
    7: "bcb040a",  # release 0.3.0
    8: "a42eef9",  # release 0.4.0
}
#: Edits to a version's tree before it is installed, where its code as committed cannot run.
#: Every commit of schema 6 (0820ba4, 49342aa, 3468b8f) has ``SqlLanes.settle``'s ``steps``
#: parameter inside its body and the ``write_steps`` call that follows above the ``if`` it
#: split, so importing any store fails (IndentationError, receiver/store/sql/lanes.py:369). The
#: edit puts both back as ``Store.settle`` declares them and version 7's code has them.
PATCHES: dict[int, list[tuple[str, str, str]]] = {
    6: [
        (
            "receiver/store/sql/lanes.py",
            "        lane: LaneResult | None = None,\n    ) -> EventState:\n"
            "        sql = self._lane_sql\n        steps: Sequence[Step] = (),\n",
            "        lane: LaneResult | None = None,\n        steps: Sequence[Step] = (),\n"
            "    ) -> EventState:\n        sql = self._lane_sql\n",
        ),
        (
            "receiver/store/sql/lanes.py",
            "            if lane is not None:\n            await write_steps(c, event_id, steps)\n",
            "            await write_steps(c, event_id, steps)\n            if lane is not None:\n",
        ),
    ],
}
POSTGRES_URL = os.environ.get(
    "RECEIVER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
GZIP_ABOVE = 300 * 1024


def prepare(version: int, work: Path) -> Path:
    """That version's code installed in its own venv; returns the venv's ``bin``."""
    tree, venv = work / f"src-v{version}", work / f"venv-v{version}"
    stamp = venv / f"installed-{VERSIONS[version]}"
    if stamp.exists():
        return venv / "bin"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.rmtree(venv, ignore_errors=True)
    tree.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", VERSIONS[version]], cwd=ROOT, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    if not (tree / "receiver" / "store").exists():
        raise SystemExit(f"v{version}: {VERSIONS[version]} has no receiver/store")
    for name, before, after in PATCHES.get(version, []):
        text = (tree / name).read_text()
        if text.count(before) != 1:
            raise SystemExit(f"v{version}: the edit of {name} no longer applies")
        (tree / name).write_text(text.replace(before, after))
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "-q",
            "--disable-pip-version-check",
            f"{tree}[postgres]",
        ],
        check=True,
    )
    stamp.touch()
    return venv / "bin"


def has_postgres_store(version: int, work: Path) -> bool:
    store = work / f"src-v{version}" / "receiver" / "store"
    return (store / "postgres.py").exists() or (store / "postgres").is_dir()


def maybe_gzip(path: Path, data: bytes) -> Path:
    """Write ``data`` at ``path``, or at ``path.gz`` (reproducibly: no name, no time) when
    larger than :data:`GZIP_ABOVE`; the other of the two is removed."""
    small = len(data) <= GZIP_ABOVE
    target = path if small else path.with_name(path.name + ".gz")
    other = path.with_name(path.name + ".gz") if small else path
    other.unlink(missing_ok=True)
    if small:
        target.write_bytes(data)
    else:
        with target.open("wb") as raw, gzip.GzipFile("", "wb", 9, raw, mtime=0) as out:
            out.write(data)
    return target


def checkpointed(path: Path) -> bytes:
    """The database file's bytes once its WAL is copied into it and removed."""
    conn = sqlite3.connect(path)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            raise SystemExit(f"{path}: the WAL could not be checkpointed (still in use?)")
        (check,) = conn.execute("PRAGMA integrity_check").fetchone()
        if check != "ok":
            raise SystemExit(f"{path}: integrity_check says {check}")
    finally:
        conn.close()
    for suffix in ("-wal", "-shm"):
        if Path(f"{path}{suffix}").exists():
            raise SystemExit(f"{path}{suffix} is left after the last connection closed")
    return path.read_bytes()


async def sqlite_inbox(version: int, bin_dir: Path, run: Path, out: Path) -> dict[str, Any]:
    db = run / "inbox.db"
    scenario = Scenario(version, run, {"url": f"sqlite:///{db}"}, sqlite_path=db)
    facts_of_run = await scenario.play(OldReceiver(bin_dir, run))
    conn = sqlite3.connect(db)
    try:
        (user_version,) = conn.execute("PRAGMA user_version").fetchone()
    finally:
        conn.close()
    if user_version != version:
        raise SystemExit(f"v{version}: the SQLite inbox has user_version {user_version}")
    maybe_gzip(out / "inbox.db", checkpointed(db))
    rows, close = sqlite_reader(db)
    try:
        facts = await inbox_facts(rows, sqlite_tables(db))
    finally:
        close()
    return {**facts, "scenario": facts_of_run}


async def postgres_inbox(version: int, bin_dir: Path, run: Path, out: Path) -> dict[str, Any]:
    import asyncpg

    from tests.support.upgrade_inboxes import dump_schema, postgres_reader

    schema = dump_schema(version)
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        store = {"url": POSTGRES_URL, "schema": schema, "pool_size": 4}
        scenario = Scenario(version, run, store, postgres=(POSTGRES_URL, schema))
        facts_of_run = await scenario.play(OldReceiver(bin_dir, run))
        await conn.execute(f'SET search_path = "{schema}"')
        found = await conn.fetchval("SELECT max(version) FROM receiver_schema_migrations")
        if found != version:
            raise SystemExit(f"v{version}: the Postgres inbox has schema version {found}")
        facts = await inbox_facts(postgres_reader(conn), await postgres_tables(conn, schema))
        dump = subprocess.run(
            [
                "pg_dump",
                "--schema",
                schema,
                "--no-owner",
                "--no-privileges",
                "--inserts",
                "--rows-per-insert",
                "50",
                "--dbname",
                POSTGRES_URL,
            ],
            check=True,
            capture_output=True,
        ).stdout
        maybe_gzip(out / "postgres.sql", dump)
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    finally:
        await conn.close()
    return {**facts, "scenario": facts_of_run}


async def make(version: int, work: Path) -> None:
    bin_dir = prepare(version, work)
    out = HERE / f"v{version}"
    out.mkdir(exist_ok=True)
    result: dict[str, Any] = {
        "schema_version": version,
        "commit": VERSIONS[version],
        "made_by": "tests/data/upgrades/make_inboxes.py",
    }
    if version in PATCHES:
        result["patched"] = sorted({name for name, _, _ in PATCHES[version]})
    # Each run's config and receiver.log stay there until the next run of this version.
    runs = work / f"run-v{version}"
    shutil.rmtree(runs, ignore_errors=True)
    (runs / "sqlite").mkdir(parents=True)
    result["sqlite"] = await sqlite_inbox(version, bin_dir, runs / "sqlite", out)
    if has_postgres_store(version, work):
        (runs / "postgres").mkdir()
        result["postgres"] = await postgres_inbox(version, bin_dir, runs / "postgres", out)
    else:
        print(f"v{version}: {VERSIONS[version]} has no Postgres store; no dump")
        for name in ("postgres.sql", "postgres.sql.gz"):
            (out / name).unlink(missing_ok=True)
    result["sinks"] = Scenario.sink_table()
    (out / "manifest.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    for backend in ("sqlite", "postgres"):
        if backend in result:
            f = result[backend]
            print(
                f"v{version} {backend}: events {f['events_by_state']} "
                f"deliveries {f['deliveries_by_sink']}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", type=int, help="default: every one")
    parser.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "receiver-upgrade-inboxes",
        help="where the trees and venvs are kept between runs",
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    for version in args.versions or sorted(VERSIONS):
        if version not in VERSIONS:
            raise SystemExit(f"no commit known for schema version {version}")
        asyncio.run(make(version, args.work.resolve()))


if __name__ == "__main__":
    main()
