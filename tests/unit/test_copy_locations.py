"""``receiver store copy``'s ``--from`` and ``--to``: what each url names, and what is shown."""

from __future__ import annotations

import pytest

from receiver.store.copy.locations import BadLocation, parse_location


def test_a_postgres_url_keeps_its_password_to_connect_and_never_shows_it() -> None:
    url = "postgresql://receiver:s3cret-pw@db.internal:5433/inbox?schema=moved&sslmode=require"
    found = parse_location("--to", url)
    assert (found.kind, found.schema, found.settings.schema) == ("postgres", "moved", "moved")
    assert found.url == "postgresql://receiver:s3cret-pw@db.internal:5433/inbox?sslmode=require"
    assert found.shown == "postgresql://db.internal:5433/inbox?schema=moved"
    assert found.named == "--to postgresql://db.internal:5433/inbox?schema=moved"
    assert "s3cret" not in repr((found.shown, found.named))


def test_sqlite_urls_name_files_relative_to_the_working_directory() -> None:
    relative = parse_location("--from", "sqlite:///data/receiver.db")
    assert (relative.kind, str(relative.path)) == ("sqlite", "data/receiver.db")
    absolute = parse_location("--to", "sqlite:////var/lib/receiver/receiver.db")
    assert str(absolute.path) == "/var/lib/receiver/receiver.db"
    assert relative.same_inbox(parse_location("--to", "sqlite:///./data/receiver.db"))
    assert not relative.same_inbox(absolute)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("memory://", "--from: a memory:// inbox lives inside a receiver process"),
        ("mysql://db/inbox", "--from: must start with sqlite:// or postgresql://"),
        ("sqlite:///", "--from: a SQLite url needs a file path"),
        ("postgresql://db/inbox?schema=Not-A-Name", "--from: ?schema=: must be a lower-case"),
    ],
)
def test_urls_that_name_no_inbox_say_why(url: str, message: str) -> None:
    with pytest.raises(BadLocation) as raised:
        parse_location("--from", url)
    assert str(raised.value).startswith(message)
