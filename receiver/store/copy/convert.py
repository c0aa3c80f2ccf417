"""A value as one backend stores it, made what the other stores.

Both backends keep times as unix seconds in a double (SQLite ``REAL``, Postgres ``double
precision``), bodies as bytes (``BLOB``, ``bytea``), headers as JSON text (``TEXT``, ``json``)
and counts as integers: for the inbox of this release most columns need nothing. The converters
here cover what a column could also be declared as on Postgres (booleans, ``timestamptz``,
``jsonb``, ``numeric``), so a future migration that uses one of those copies right, and any other
type is refused before anything is written.

A converter takes one column of a batch (its values, None included) and returns the values to
write; values already of a type the target takes pass through untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from receiver.errors import StoreError

if TYPE_CHECKING:
    from receiver.store.copy.locations import Kind

Converter = Callable[[Sequence[Any]], Sequence[Any]]

TEXT_TYPES = ("text", "json", "jsonb", "character varying", "character")
INTEGER_TYPES = ("integer", "bigint", "smallint")
FLOAT_TYPES = ("double precision", "real")


def _family(pg_type: str) -> str:
    """A Postgres type without its modifier: ``character varying(20)`` -> ``character varying``."""
    return pg_type.split("(", 1)[0].strip()


def to_bytes(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def to_text(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode()
    return str(value)


def to_float(value: Any) -> float:
    return float(value)


def to_bool(value: Any) -> bool:
    return bool(value)


def to_int(value: Any) -> int:
    return int(value)


def epoch_to_aware(value: Any) -> datetime:
    return datetime.fromtimestamp(float(value), UTC)


def epoch_to_naive(value: Any) -> datetime:
    return datetime.fromtimestamp(float(value), UTC).replace(tzinfo=None)


def datetime_to_epoch(value: Any) -> float:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return float(value.timestamp())


def to_decimal(value: Any) -> Decimal:
    return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)


def each(fn: Callable[[Any], Any], *keep: type) -> Converter:
    """A converter applying ``fn`` to each value that is not None nor of a type in ``keep``."""

    def column(values: Sequence[Any]) -> Sequence[Any]:
        return [v if v is None or type(v) in keep else fn(v) for v in values]

    return column


_TO_POSTGRES: dict[str, Converter | None] = {
    "bytea": each(to_bytes, bytes),
    "boolean": each(to_bool, bool),
    "timestamp with time zone": each(epoch_to_aware),
    "timestamp without time zone": each(epoch_to_naive),
    "numeric": each(to_decimal, Decimal),
    **dict.fromkeys(TEXT_TYPES, each(to_text, str)),
    **dict.fromkeys(FLOAT_TYPES, each(to_float, float, int)),
    **dict.fromkeys(INTEGER_TYPES, each(to_int, int)),
}

_FROM_POSTGRES: dict[str, Converter | None] = {
    "bytea": None,
    "boolean": each(to_int, int),
    "timestamp with time zone": each(datetime_to_epoch),
    "timestamp without time zone": each(datetime_to_epoch),
    "numeric": each(to_float, float),
    **dict.fromkeys(TEXT_TYPES, None),
    **dict.fromkeys(FLOAT_TYPES, None),
    **dict.fromkeys(INTEGER_TYPES, None),
}


def converter(source: Kind, source_type: str, target: Kind, target_type: str) -> Converter | None:
    """What a value of a ``source_type`` column needs to be written into a ``target_type``
    one (None: nothing); a type this release does not copy is a StoreError."""
    if source == target:
        return None  # the same schema on the same backend: every value as it is
    pg_type = _family(target_type if target == "postgres" else source_type)
    table = _TO_POSTGRES if target == "postgres" else _FROM_POSTGRES
    if pg_type not in table:
        raise StoreError(f"a Postgres column of type {pg_type} is not one this release copies")
    return table[pg_type]
