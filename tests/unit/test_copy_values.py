"""``receiver store copy``'s values: what each backend stores, made what the other stores."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from receiver.errors import StoreError
from receiver.store.copy.convert import converter


def test_the_inbox_columns_need_nothing_or_only_a_stray_type_mended() -> None:
    assert converter("sqlite", "real", "sqlite", "real") is None
    assert converter("postgres", "bytea", "postgres", "bytea") is None
    for pg_type in ("double precision", "bytea", "json", "text", "integer", "bigint"):
        assert converter("postgres", pg_type, "sqlite", "text") is None, pg_type
    body = b"\xff\x00 not utf-8"
    to_bytea = converter("sqlite", "blob", "postgres", "bytea")
    assert to_bytea is not None
    assert to_bytea([body, "text stored as text", None]) == [body, b"text stored as text", None]
    assert to_bytea([body])[0] is body  # already bytes: untouched
    to_json = converter("sqlite", "text", "postgres", "json")
    assert to_json is not None and to_json([b'{"a": 1}', '{"b": 2}']) == ['{"a": 1}', '{"b": 2}']
    to_double = converter("sqlite", "real", "postgres", "double precision")
    assert to_double is not None and to_double([1, 1.5, "2.25", None]) == [1, 1.5, 2.25, None]


def test_booleans_and_times_a_future_column_could_use() -> None:
    to_bool = converter("sqlite", "integer", "postgres", "boolean")
    from_bool = converter("postgres", "boolean", "sqlite", "integer")
    assert to_bool is not None and from_bool is not None
    assert to_bool([1, 0, None, True]) == [True, False, None, True]
    assert from_bool([True, False, None]) == [1, 0, None]

    epoch = 1_700_000_000.123456
    to_time = converter("sqlite", "real", "postgres", "timestamp with time zone")
    from_time = converter("postgres", "timestamp with time zone", "sqlite", "real")
    assert to_time is not None and from_time is not None
    [when] = to_time([epoch])
    assert when == datetime.fromtimestamp(epoch, UTC) and when.tzinfo is not None
    assert from_time(to_time([epoch, None])) == [pytest.approx(epoch, abs=1e-6), None]


def test_a_type_the_copy_does_not_know_is_refused_before_anything_is_written() -> None:
    with pytest.raises(StoreError, match="of type point is not one this release copies"):
        converter("sqlite", "text", "postgres", "point")
    with pytest.raises(StoreError, match="of type tsvector"):
        converter("postgres", "tsvector", "sqlite", "text")
