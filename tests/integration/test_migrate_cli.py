"""``receiver migrate``: several processes at once on a fresh schema, SQLite, bad targets."""

import asyncio

import asyncpg

from receiver.store import postgres, sqlite
from tests.helpers import free_port, write_config
from tests.integration.test_cli import assert_one_clean_line, run_cli
from tests.postgres import POSTGRES_URL, fresh_schema, require_postgres


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
        latest = postgres.SCHEMA_VERSION
        assert sum(f"migrated from version 0 to {latest}" in out for out in outs) == 1, outs
        assert sum(f"already at version {latest}" in out for out in outs) == 3, outs
        assert all(f"(schema {schema})" in out for out in outs)
        conn = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
        try:
            migrations = await conn.fetchval("SELECT count(*) FROM receiver_schema_migrations")
            assert migrations == postgres.SCHEMA_VERSION
            assert await conn.fetchval("SELECT count(*) FROM events") == 0
        finally:
            await conn.close()


async def test_migrate_a_sqlite_inbox_creates_it(tmp_path):
    config = store_config(tmp_path, "lite.toml", url="sqlite:///data/inbox.db")
    code, out, err = await run_cli("migrate", "--config", str(config), cwd=tmp_path)
    assert code == 0, err
    expected = f"inbox sqlite:///data/inbox.db: schema at version {sqlite.SCHEMA_VERSION}"
    assert out.strip() == expected
    assert (tmp_path / "data" / "inbox.db").is_file()


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
    for command in ("migrate", "serve"):
        code, _out, err = await run_cli(command, "--config", str(config), cwd=tmp_path)
        assert code == 1, (command, err)
        assert_one_clean_line(err)
        assert "connection refused" in err
        assert "s3cret" not in err
