"""A Postgres inbox is backed up with pg_dump: ``receiver backup`` prints the pg_dump and
pg_restore commands for the configured store's schema (its URL without the password) and
exits 2, and docs/operations.md shows the same. Here the printed pair runs on a real schema
holding events: dump, drop the schema, restore; ``receiver migrate status`` exits 0 and every
event and delivery is back."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import asyncpg

from receiver.store import postgres
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import ROOT, write_config
from tests.support.old_inbox import make_postgres_inbox, postgres_rows, postgres_state
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres
from tests.support.services import require_tool

LATEST = postgres.SCHEMA_VERSION
DOCS_STORE = {"url": "postgresql://receiver:not-this-one@db.internal:5432/receiver"}
DOCS_FENCE = re.compile(r"^```sh postgres-backup\n(.*?)^```$", re.M | re.S)


def config(tmp_path: Path, store: dict[str, str]) -> Path:
    return write_config(
        tmp_path / "config.toml", {"webhook": {"secrets": ["whsec_pg_backup"]}, "store": store}
    )


def commands(out: str) -> tuple[str, str]:
    (dump,) = [line for line in out.splitlines() if line.startswith("pg_dump ")]
    (restore,) = [line for line in out.splitlines() if line.startswith("pg_restore ")]
    return dump, restore


def run(command: str, cwd: Path) -> None:
    argv = shlex.split(command)
    argv[0] = require_tool(argv[0], installed_by="apt-get install postgresql-client")
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"


async def test_the_printed_pg_dump_and_pg_restore_bring_every_event_back(tmp_path: Path) -> None:
    require_postgres()
    async with fresh_schema() as schema:
        rows = await make_postgres_inbox(schema, LATEST, events=40)
        cfg = config(tmp_path, {"url": POSTGRES_URL, "schema": schema})
        code, out, err = await run_cli("backup", "--config", str(cfg))
        assert code == 2, err
        assert_one_clean_line(err)
        assert "the inbox is on Postgres: back it up with pg_dump" in err
        dump, restore = commands(out)
        assert f"--schema={schema} --format=custom" in dump

        run(dump, tmp_path)
        conn = await asyncpg.connect(POSTGRES_URL)
        try:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        finally:
            await conn.close()
        assert (await postgres_state(schema))["exists"] is False
        run(restore, tmp_path)

        code, out, err = await run_cli("migrate", "status", "--config", str(cfg))
        assert code == 0, out + err
        assert await postgres_rows(schema) == {table: sorted(r) for table, r in rows.items()}
        # Run again over the schema as it now is: --clean drops and creates it whole.
        run(restore, tmp_path)
        assert await postgres_rows(schema) == {table: sorted(r) for table, r in rows.items()}

        code, out, err = await run_cli("restore", "--config", str(cfg), "inbox.dump")
        assert (code, out) == (2, "")
        assert_one_clean_line(err)
        assert "pg_restore" in err


async def test_the_docs_show_what_the_command_prints_and_no_password(tmp_path: Path) -> None:
    """For the docs' store (schema set: nothing is connected to), the lines printed are the
    documented ones, and the password in the URL is in neither output."""
    cfg = config(tmp_path, {**DOCS_STORE, "schema": "receiver"})
    code, out, err = await run_cli("backup", "--config", str(cfg))
    assert code == 2, err
    assert "not-this-one" not in out + err
    (documented,) = DOCS_FENCE.findall((ROOT / "docs" / "operations.md").read_text())
    assert out == documented
    assert "PGPASSWORD" in out


async def test_without_a_schema_the_one_on_the_search_path_is_named(tmp_path: Path) -> None:
    require_postgres()
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        current = await conn.fetchval("SELECT current_schema()")
    finally:
        await conn.close()
    code, out, err = await run_cli(
        "backup", "--config", str(config(tmp_path, {"url": POSTGRES_URL}))
    )
    assert code == 2, err
    dump, _restore = commands(out)
    assert f"--schema={current} " in dump
