"""The tables of an inbox as a copy sees them, read from each store's own schema.

Each backend's side reads its tables, columns (with their declared types), primary keys and
foreign keys from the database itself (:class:`Table`); :func:`plan` pairs the source's with the
target's and puts them in an order where every table comes after the tables it refers to.

What is kept by hand is only what the schema cannot say:

- :data:`KNOWN_TABLES`: every table an inbox at this release's schema version holds, and what it
  is; any other table (another application's, in a shared Postgres schema; the schema's own
  bookkeeping) is not the inbox's and is left alone. A migration that adds a table adds it
  here too (a test compares this list with the tables a new inbox has on both backends).
- :data:`LEASE_COLUMNS`: a lease names a process of the source's receivers; on the target it
  means nothing, so it is copied cleared, and the target's receivers claim that work anew.
- :data:`ROWID_COLUMNS`: the Postgres column a SQLite table keeps as its hidden ``rowid`` (the
  order events arrived in, which breaks ties between events received at the same time).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from receiver.errors import StoreError
from receiver.store.copy.convert import Converter, converter
from receiver.store.copy.locations import Kind

#: Every table of an inbox at this release's schema version, and what it holds.
KNOWN_TABLES: dict[str, str] = {
    "events": "the stored webhooks: body, headers, state, enrichment",
    "deliveries": "one per event and sink: state, attempts, next attempt, batch",
    "event_steps": "each event's timeline (upstream calls, delivery attempts)",
    "lanes": "each sink's pacing, circuit and pause",
    "watches": "jobs followed in pull mode",
    "job_outcomes": "the job-outcome ledger (one event per job outcome)",
    "asset_ledger": "the asset ledger reconcile judges assets by",
    "redeliveries": "redelivery batches and their progress",
}

#: Copied as NULL: no lease of the source means anything on the target.
LEASE_COLUMNS = ("lease_owner", "lease_expires_at")
#: The column whose values count the leases cleared.
LEASE_HOLDER = "lease_owner"

#: table -> the Postgres column that SQLite keeps as the table's ``rowid``.
ROWID_COLUMNS = {"events": "seq"}


@dataclass(frozen=True)
class Column:
    """One column: its name, its type as the store declares it (lower case), whether the store
    generates its values (a Postgres identity), and how SQL names it (``rowid`` for the column
    SQLite keeps as the rowid)."""

    name: str
    type: str
    generated: bool = False
    sql: str = ""

    @property
    def ref(self) -> str:
        return self.sql or quoted(self.name)


@dataclass(frozen=True)
class Table:
    """One table: its columns in order, its primary key, the tables its foreign keys name."""

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    parents: tuple[str, ...] = ()

    def column(self, name: str) -> Column | None:
        for column in self.columns:
            if column.name == name:
                return column
        return None


@dataclass(frozen=True)
class Pair:
    """A column as the source reads it and the target writes it."""

    source: Column
    target: Column
    convert: Converter | None
    cleared: bool


@dataclass(frozen=True)
class TablePlan:
    """How one table is copied."""

    name: str
    key: tuple[str, ...]
    pairs: tuple[Pair, ...]
    source: Table
    target: Table

    @property
    def key_positions(self) -> tuple[int, ...]:
        names = [pair.source.name for pair in self.pairs]
        return tuple(names.index(name) for name in self.key)

    @property
    def lease_position(self) -> int | None:
        for n, pair in enumerate(self.pairs):
            if pair.source.name == LEASE_HOLDER:
                return n
        return None


def quoted(name: str) -> str:
    """An SQL identifier, quoted alike for SQLite and Postgres."""
    return '"' + name.replace('"', '""') + '"'


def plan(
    source_kind: Kind,
    source: Mapping[str, Table],
    target_kind: Kind,
    target: Mapping[str, Table],
    *,
    rowids: bool = True,
) -> list[TablePlan]:
    """Every table's plan, parents first. ``rowids``: whether a SQLite target is given each
    event's rowid (not when adding to an inbox that has rows: another event may have it)."""
    missing = sorted(set(KNOWN_TABLES) - set(source)) or sorted(set(KNOWN_TABLES) - set(target))
    if missing:
        side = "source" if missing[0] not in source else "target"
        raise StoreError(f"the {side} has no table {missing[0]}: it is not a whole inbox")
    plans = []
    for table in in_dependency_order(source[name] for name in KNOWN_TABLES):
        there = target[table.name]
        if table.key != there.key:
            raise StoreError(
                f"table {table.name} has key {table.key} on the source, {there.key} on the "
                "target: they are not the same schema"
            )
        pairs = _pairs(source_kind, table, target_kind, there, rowids=rowids)
        plans.append(TablePlan(table.name, table.key, pairs, table, there))
    return plans


def _pairs(
    source_kind: Kind, table: Table, target_kind: Kind, there: Table, *, rowids: bool
) -> tuple[Pair, ...]:
    pairs = []
    for column in there.columns:
        found = table.column(column.name)
        if found is None:
            if column.generated or column.sql == "rowid":
                continue  # the target makes its own
            raise StoreError(
                f"column {table.name}.{column.name} of the target is not on the source: they "
                "are not the same schema"
            )
        if column.sql == "rowid" and not rowids:
            continue
        cleared = column.name in LEASE_COLUMNS
        convert = converter(source_kind, found.type, target_kind, column.type)
        pairs.append(Pair(found, column, None if cleared else convert, cleared))
    copied = {pair.source.name for pair in pairs}
    for column in table.columns:
        if column.name not in copied and not (column.generated or column.sql == "rowid"):
            raise StoreError(
                f"column {table.name}.{column.name} of the source is not on the target: they "
                "are not the same schema"
            )
    return tuple(pairs)


def in_dependency_order(tables: Iterable[Table]) -> list[Table]:
    """``tables`` with each after every table it refers to, otherwise in the order given."""
    waiting = list(tables)
    names = {table.name for table in waiting}
    ordered: list[Table] = []
    placed: set[str] = set()
    while waiting:
        for table in waiting:
            if all(p in placed or p == table.name or p not in names for p in table.parents):
                break
        else:
            raise StoreError(
                f"the foreign keys of tables {sorted(t.name for t in waiting)} form a circle"
            )
        waiting.remove(table)
        ordered.append(table)
        placed.add(table.name)
    return ordered
