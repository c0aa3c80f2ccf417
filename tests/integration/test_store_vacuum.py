"""``receiver store vacuum`` as users run it: its own process, on an inbox an earlier release
made (no incremental vacuum), refused while ``receiver serve`` runs on it."""

from __future__ import annotations

import sqlite3
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

import aiohttp

from receiver.store.sqlite.space import AUTO_VACUUM_INCREMENTAL
from tests.support import old_inbox
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import ReceiverProcess, free_port, write_config
from tests.support.pipeline import signed
from tests.support.postgres import POSTGRES_URL

SECRET = "whsec_vacuum_" + "7a" * 12
LATEST = old_inbox.sqlite_schema.SCHEMA_VERSION


def config(tmp_path: Path, store: dict[str, Any]) -> Path:
    return write_config(
        tmp_path / "config.toml",
        {
            "server": {"host": "127.0.0.1", "port": free_port(), "shutdown_timeout_seconds": 2},
            "admin": {"port": free_port()},
            "webhook": {"secrets": [SECRET]},
            "store": store,
            "log": {"format": "json"},
            "sinks": [{"name": "files", "type": "download", "directory": "downloads"}],
        },
    )


def rows(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    with closing(sqlite3.connect(db)) as conn:
        return {
            table: conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
            for table in ("events", "deliveries")
        }


def pragma(db: Path, name: str) -> Any:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]


async def test_an_older_inbox_is_rewritten_smaller_with_every_row_and_gives_space_back_after(
    tmp_path: Path,
) -> None:
    db = tmp_path / "inbox.db"
    old_inbox.make_sqlite_inbox(db, LATEST, events=400)  # as releases before 0.5.0 made it
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("DELETE FROM events WHERE rowid % 2 = 0")  # free pages inside the file
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert pragma(db, "auto_vacuum") == 0 and pragma(db, "freelist_count") > 0
    before, size = rows(db), db.stat().st_size
    cfg = config(tmp_path, {"url": "sqlite:///inbox.db"})

    code, out, err = await run_cli("store", "vacuum", "--config", str(cfg), cwd=tmp_path)

    assert code == 0, err
    assert "converted to incremental vacuum" in out, out
    assert rows(db) == before
    assert pragma(db, "auto_vacuum") == AUTO_VACUUM_INCREMENTAL
    assert pragma(db, "journal_mode") == "wal"
    assert pragma(db, "freelist_count") == 0
    assert pragma(db, "integrity_check") == "ok"
    assert db.stat().st_size < size
    code, out, err = await run_cli("store", "vacuum", "--config", str(cfg), cwd=tmp_path)
    assert code == 0, err
    assert "already gave freed space back" in out


async def test_refused_while_a_receiver_serves_the_inbox_which_goes_on_taking_webhooks(
    tmp_path: Path,
) -> None:
    cfg = config(tmp_path, {"url": "sqlite:///inbox.db"})
    server = ReceiverProcess(cfg)
    server.start()
    try:
        await server.wait_ready()
        db = tmp_path / "inbox.db"
        with open(db, "rb") as f:
            header = f.read(100)

        code, out, err = await run_cli("store", "vacuum", "--config", str(cfg), cwd=tmp_path)

        assert (code, out) == (1, ""), err
        assert_one_clean_line(err)
        assert f"the inbox {db.name} is in use by another process" in err, err
        with open(db, "rb") as f:
            assert f.read(100) == header  # not switched, not rewritten
        payload = {"id": str(uuid.uuid4()), "object": "event", "event": "job.completed"}
        payload["job_id"] = str(uuid.uuid4())
        body, headers = signed(payload, SECRET)
        url = f"http://127.0.0.1:{server.public_port}/webhooks"
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=body, headers=headers) as response,
        ):
            assert response.status == 200, await response.text()
    finally:
        server.stop()


async def test_a_postgres_or_memory_inbox_is_not_a_file_to_vacuum(tmp_path: Path) -> None:
    for url, says in ((POSTGRES_URL, "autovacuum"), ("memory://", "inside the running")):
        cfg = config(tmp_path, {"url": url})
        code, out, err = await run_cli("store", "vacuum", "--config", str(cfg), cwd=tmp_path)
        assert (code, out) == (2, ""), err
        assert says in err
        assert_one_clean_line(err)
