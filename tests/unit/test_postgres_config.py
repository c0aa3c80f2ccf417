"""The [store] keys only the Postgres store reads, and the store url from the environment."""

import sys

import pytest

from receiver.cli.check_config import describe
from receiver.config.load import parse_settings
from receiver.errors import ConfigError
from receiver.extras import install_hint

BASE = {"webhook": {"secrets": ["whsec_x"]}}
PG = "postgresql://receiver:s3cret-one@db.internal:5432/receiver"


def settings(store, env=None):
    return parse_settings({**BASE, "store": store}, env=env or {})


def problems(store):
    with pytest.raises(ConfigError) as caught:
        settings(store)
    return caught.value.problems


def test_postgres_keys_and_defaults():
    store = settings({"url": PG, "schema": "receiver", "pool_size": 5}).store
    assert (store.schema, store.pool_size, store.auto_migrate) == ("receiver", 5, True)
    assert store.timeout_seconds == 5.0


@pytest.mark.parametrize("schema", ["Receiver", "1abc", "has space", "a-b", 'x"y', "x" * 64])
def test_a_schema_must_be_a_plain_lower_case_name(schema):
    assert [p for p in problems({"url": PG, "schema": schema}) if p.startswith("store.schema")]


def test_a_schema_needs_a_postgres_url():
    assert problems({"url": "sqlite:///x.db", "schema": "receiver"}) == [
        "store.schema: only a postgresql:// store has schemas"
    ]


def test_timeout_and_pool_size_must_be_positive():
    found = problems({"url": PG, "timeout_seconds": 0, "pool_size": 0})
    assert "store.timeout_seconds: must be positive" in found
    assert "store.pool_size: must be at least 1" in found


def test_store_url_from_the_environment_wins_and_is_masked_in_the_summary():
    s = settings(
        {"url": "sqlite:///data/receiver.db"},
        env={"RECEIVER_STORE_URL": PG + "?sslmode=require&password=s3cret-two"},
    )
    assert s.store.url.startswith(PG)
    summary = describe(s)
    assert "postgresql://receiver:****@db.internal:5432/receiver (schema <search_path>" in summary
    assert "s3cret" not in summary


def test_without_asyncpg_a_postgres_url_names_the_extra(monkeypatch, tmp_path, capsys):
    from receiver.cli import main
    from receiver.store import open_store

    monkeypatch.setitem(sys.modules, "asyncpg", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "receiver.store.postgres", raising=False)
    with pytest.raises(ConfigError, match=r"pip install 'receiver\[postgres\]'"):
        open_store(settings({"url": PG}).store)

    config = tmp_path / "config.toml"
    config.write_text(f'[webhook]\nsecrets = ["whsec_x"]\n[store]\nurl = "{PG}"\n')
    assert main(["check-config", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "receiver: config: store.url: the postgres store needs an optional library; "
        + install_hint("postgres")
    )
