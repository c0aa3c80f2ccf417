"""docs/operations.md's backup recipe, run with the sqlite3 command against a running receiver.

The inbox is in WAL mode: recent commits live in receiver.db-wal until a checkpoint, so copying
receiver.db alone misses them. `.backup` (SQLite's online backup API) takes a consistent copy
while the receiver keeps running.
"""

import shutil
import sqlite3

from tests.deploy.support import run_tool
from tests.support.helpers import ReceiverProcess, free_port, post_webhook, write_config
from tests.support.services import require_tool

SECRET = "whsec_backup"
EVENTS = 5


async def test_online_backup_holds_every_accepted_event_a_file_copy_does_not(tmp_path):
    sqlite_cli = require_tool("sqlite3")
    config = write_config(
        tmp_path / "config.toml",
        {
            "server": {"host": "127.0.0.1", "port": free_port()},
            "admin": {"port": free_port()},
            "webhook": {"secrets": [SECRET]},
            "store": {"url": "sqlite:///data/receiver.db"},
            "sinks": [{"name": "files", "type": "download", "directory": "downloads"}],
        },
    )
    proc = ReceiverProcess(config, role="intake")
    proc.start()
    try:
        await proc.wait_ready()
        url = f"http://127.0.0.1:{proc.public_port}/webhooks"
        for n in range(EVENTS):
            payload = {"id": f"evt-{n}", "object": "event", "event": "job.failed", "job_id": "j"}
            assert await post_webhook(url, SECRET, payload) == 200

        database = tmp_path / "data" / "receiver.db"
        backup = tmp_path / "backup.db"
        run_tool([sqlite_cli, str(database), f".backup '{backup}'"])
        assert run_tool([sqlite_cli, str(backup), "PRAGMA integrity_check"]).strip() == "ok"
        count = run_tool([sqlite_cli, str(backup), "SELECT count(*) FROM events"])
        assert int(count) == EVENTS

        copied = tmp_path / "copied.db"
        shutil.copy(database, copied)
        try:
            with sqlite3.connect(copied) as conn:
                in_copy = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        except sqlite3.DatabaseError:
            in_copy = 0
        assert in_copy < EVENTS
        assert proc.terminate() == 0
    finally:
        proc.stop()
