"""``[pull]`` and ``[[reconcile]]``: defaults, limits, and one problem line per bad key."""

import pytest

from receiver.config.load import parse_settings
from receiver.errors import ConfigError

BASE = {"webhook": {"secrets": ["whsec_x"]}}
COLLECTION = "3f1c2a4e-5b6d-4e7f-8a9b-0c1d2e3f4a5b"


def test_defaults_follow_the_contract():
    settings = parse_settings(BASE, env={})
    assert (settings.pull.concurrency, settings.pull.wait_seconds) == (20, 60)
    assert settings.pull.watch_expiry_hours == 24
    assert settings.reconcile == ()


def test_reconcile_tables_are_read_in_order():
    settings = parse_settings(
        {
            **BASE,
            "pull": {"concurrency": 5, "wait_seconds": 120},
            "reconcile": [
                {"collection_id": COLLECTION},
                {"collection_id": COLLECTION.upper(), "interval_minutes": 5},
            ],
        },
        env={},
    )
    assert settings.pull.wait_seconds == 120
    assert [(r.collection_id, r.interval_minutes) for r in settings.reconcile] == [
        (COLLECTION, 60.0),
        (COLLECTION.upper(), 5.0),
    ]


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"pull": {"wait_seconds": 121}}, "pull.wait_seconds: must be between 1 and 120"),
        ({"pull": {"wait_seconds": 0}}, "pull.wait_seconds: must be between 1 and 120"),
        ({"pull": {"concurrency": 0}}, "pull.concurrency: must be at least 1"),
        ({"pull": {"watch_expiry_hours": 0}}, "pull.watch_expiry_hours: must be positive"),
        ({"pull": {"waits": 3}}, "pull.waits: unknown key"),
        ({"reconcile": {"collection_id": COLLECTION}}, "reconcile: must be an array of tables"),
        ({"reconcile": [{}]}, "reconcile[0].collection_id: missing"),
        (
            {"reconcile": [{"collection_id": "my-collection"}]},
            "reconcile[0].collection_id: must be a collection id (a UUID)",
        ),
        (
            {"reconcile": [{"collection_id": COLLECTION, "interval_minutes": 0}]},
            "reconcile[0].interval_minutes: must be at least 1",
        ),
        (
            {"reconcile": [{"collection_id": COLLECTION, "interval_minutes": "hourly"}]},
            "reconcile[0].interval_minutes: must be a number",
        ),
        (
            {"reconcile": [{"collection_id": COLLECTION, "every": 5}]},
            "reconcile[0].every: unknown key",
        ),
    ],
)
def test_bad_values_name_their_key(data, problem):
    with pytest.raises(ConfigError) as info:
        parse_settings({**BASE, **data}, env={})
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems
