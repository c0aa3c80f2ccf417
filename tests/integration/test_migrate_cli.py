"""``receiver migrate``: several processes at once on a fresh schema, SQLite, bad targets."""

import asyncio

import asyncpg

import receiver
from receiver.store import postgres, sqlite
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import free_port, write_config
from tests.support.old_inbox import file_state, make_sqlite_inbox
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres


def store_config(tmp_path, name, **store):
    return write_config(
        tmp_path / name, {"webhook": {"secrets": ["whsec_migrate"]}, "store": store}
    )


async def test_migrate_processes_started_together_apply_the_schema_once(tmp_path):
    require_postgres()
    async with fresh_schema() as schema:
        config = store_config(tmp_path, "pg.toml", url=POSTGRES_URL, schema=schema)
        results = await asyncio.gather(
            *(run_cli("migrate", "--config", str(config)) for _ in range(4))
        )

        assert [code for code, _out, _err in results] == [0] * 4, results
        outs = sorted(out.strip() for _code, out, _err in results)
        version = postgres.SCHEMA_VERSION
        assert sum(f"migrated from version 0 to {version}" in out for out in outs) == 1, outs
        assert sum(f"already at version {version}" in out for out in outs) == 3, outs
        assert all(f"(schema {schema})" in out for out in outs)
        conn = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
        try:
            migrations = await conn.fetchval("SELECT count(*) FROM receiver_schema_migrations")
            assert migrations == version
            assert await conn.fetchval("SELECT count(*) FROM events") == 0
        finally:
            await conn.close()


async def test_migrate_a_sqlite_inbox_creates_it(tmp_path):
    config = store_config(tmp_path, "lite.toml", url="sqlite:///data/inbox.db")
    code, out, err = await run_cli("migrate", "--config", str(config), cwd=tmp_path)
    assert code == 0, err
    version = sqlite.SCHEMA_VERSION
    applied = ", ".join(str(v) for v in range(1, version + 1))
    assert out.strip() == (
        f"inbox sqlite:///data/inbox.db: migrated from version 0 to {version} (applied {applied})"
    )
    assert (tmp_path / "data" / "inbox.db").is_file()
    assert not list((tmp_path / "data").glob("*before-migrate*"))  # nothing to keep of a new one

    code, out, err = await run_cli("migrate", "--config", str(config), cwd=tmp_path)
    assert code == 0, err
    assert out.strip() == f"inbox sqlite:///data/inbox.db: already at version {version}"


async def test_migrate_and_serve_name_an_unreachable_database_in_one_line(tmp_path):
    url = f"postgresql://postgres:s3cret-pw@127.0.0.1:{free_port()}/test"
    config = write_config(
        tmp_path / "down.toml",
        {
            "server": {"port": free_port()},
            "admin": {"port": free_port()},
            "webhook": {"secrets": ["whsec_migrate"]},
            "store": {"url": url, "timeout_seconds": 2},
        },
    )
    for command in (("migrate",), ("migrate", "status"), ("migrate", "--dry-run"), ("serve",)):
        code, _out, err = await run_cli(*command, "--config", str(config), cwd=tmp_path)
        assert code == 1, (command, err)
        assert_one_clean_line(err)
        assert "connection refused" in err
        assert "s3cret" not in err


async def test_serve_without_auto_migrate_on_an_old_inbox_says_to_run_migrate(tmp_path):
    db = tmp_path / "inbox.db"
    make_sqlite_inbox(db, 3)
    before = file_state(db)
    config = write_config(
        tmp_path / "manual.toml",
        {
            "server": {"port": free_port()},
            "admin": {"port": free_port()},
            "webhook": {"secrets": ["whsec_migrate"]},
            "store": {"url": f"sqlite:///{db}", "auto_migrate": False},
        },
    )
    code, out, err = await run_cli("serve", "--config", str(config), cwd=tmp_path)
    assert (code, out) == (1, ""), err
    assert_one_clean_line(err)
    assert err.strip() == (
        f"receiver: the inbox {db} has schema version 3, this release ({receiver.__version__}) "
        f"needs {sqlite.SCHEMA_VERSION}: run `receiver migrate` to upgrade it (`receiver migrate "
        "status` shows what is pending), or set store.auto_migrate = true"
    )
    assert file_state(db) == before  # refused before anything opened it for writing
