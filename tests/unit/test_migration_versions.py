"""The migrations' descriptions, one for each schema version and the same on both stores; the
names of the copies kept before a migration, and which of them pruning keeps."""

from __future__ import annotations

from pathlib import Path

from receiver.store import postgres, sqlite
from receiver.store.sql.versions import DESCRIPTIONS, pending
from receiver.store.sqlite.backup_copy import copies, copy_name, prune


def test_every_schema_version_of_both_stores_is_described_once() -> None:
    assert sorted(DESCRIPTIONS) == list(range(1, sqlite.SCHEMA_VERSION + 1))
    assert sorted(DESCRIPTIONS) == list(range(1, postgres.SCHEMA_VERSION + 1))
    # Postgres records each migration with the description the status shows.
    assert {m.version: m.description for m in postgres.MIGRATIONS} == DESCRIPTIONS
    assert all(text and text == text.strip() for text in DESCRIPTIONS.values())


def test_pending_lists_the_migrations_between_two_versions() -> None:
    assert pending(5, 8) == ((6, DESCRIPTIONS[6]), (7, DESCRIPTIONS[7]), (8, DESCRIPTIONS[8]))
    assert pending(8, 8) == ()
    assert pending(9, 8) == ()
    assert [v for v, _ in pending(0, 8)] == list(range(1, 9))


def test_a_copy_is_named_beside_the_inbox_by_kind_and_time(tmp_path: Path) -> None:
    db = tmp_path / "inbox.db"
    stamp = "20250102T030405Z"
    assert (
        copy_name(db, "before-migrate-v3", stamp)
        == tmp_path / f"inbox.db.before-migrate-v3-{stamp}"
    )
    assert copy_name(db, "before-migrate-v3", stamp, 2).name.endswith(f"{stamp}-2")


def test_prune_keeps_the_newest_copies_of_one_kind_and_nothing_else(tmp_path: Path) -> None:
    db = tmp_path / "inbox.db"
    names = [
        "inbox.db.before-migrate-v5-20250301T000000Z",
        "inbox.db.before-migrate-v1-20240101T000000Z",
        "inbox.db.before-migrate-v2-20240101T000000Z-2",
        "inbox.db.before-migrate-v3-20241231T235959Z",
        "inbox.db.before-reindex-20200101T000000Z",  # another kind
        "inbox.db.before-migrate-v3-notatime",  # not a copy's name
        "other.db.before-migrate-v1-20200101T000000Z",  # another inbox's
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in copies(db, "before-migrate")] == [
        "inbox.db.before-migrate-v1-20240101T000000Z",
        "inbox.db.before-migrate-v2-20240101T000000Z-2",
        "inbox.db.before-migrate-v3-20241231T235959Z",
        "inbox.db.before-migrate-v5-20250301T000000Z",
    ]

    removed = prune(db, "before-migrate", keep=3)
    assert [p.name for p in removed] == ["inbox.db.before-migrate-v1-20240101T000000Z"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(set(names) - {removed[0].name})
    assert prune(db, "before-migrate", keep=3) == []
