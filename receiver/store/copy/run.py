"""The whole copy: check both inboxes, make the target when it has no inbox yet, copy every table
from the source's snapshot in bounded batches, then compare every table's keys.

Nothing is written to either side before every check has passed: the source at this release's
schema version, the target reachable, at that version or with no inbox yet (then created), and
empty unless ``append``. The source is only ever read.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from receiver import __version__
from receiver.errors import StoreError, StoreNewer, StoreUnavailable
from receiver.store.copy.locations import Location
from receiver.store.copy.postgres_side import PostgresSide
from receiver.store.copy.side import Key, Side
from receiver.store.copy.sqlite_side import SqliteSide, serving_processes
from receiver.store.copy.tables import KNOWN_TABLES, TablePlan, plan
from receiver.store.copy.verify import KeyCheck, compare_keys
from receiver.store.schema_version import SCHEMA_VERSION

DEFAULT_BATCH = 5000
#: Progress lines come at most this often.
PROGRESS_SECONDS = 1.0

Say = Callable[[str], None]


@dataclass(frozen=True)
class CopyOptions:
    source: Location
    target: Location
    dry_run: bool = False
    append: bool = False
    batch: int = DEFAULT_BATCH


@dataclass
class TableCopy:
    """One table's copy: rows in the source's snapshot, read, inserted, skipped (their key was
    already on the target), leases cleared, and the key comparison."""

    name: str
    rows: int = 0
    read: int = 0
    written: int = 0
    skipped: int = 0
    leases: int = 0
    check: KeyCheck | None = None

    def problems(self, *, append: bool) -> list[str]:
        """What differs between the target and the source's snapshot (empty: nothing)."""
        found = []
        if self.read != self.rows:
            found.append(f"{self.read:,} of {_rows(self.rows)} read")
        if self.check is not None:
            if self.check.missing:
                found.append(f"{_rows(self.check.missing)} missing on the target")
            if self.check.extra and not append:
                found.append(f"{_rows(self.check.extra)} on the target not in the source")
        return [f"{self.name}: {text}" for text in found]


def _rows(count: int) -> str:
    return f"{count:,} row{'' if count == 1 else 's'}"


@dataclass
class CopyReport:
    """What a copy (or a dry run) found and did."""

    options: CopyOptions
    target_version: int  # before the copy: 0 when the target had no inbox
    tables: list[TableCopy] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def problems(self) -> list[str]:
        return [p for table in self.tables for p in table.problems(append=self.options.append)]


def open_side(location: Location) -> SqliteSide | PostgresSide:
    return SqliteSide(location) if location.kind == "sqlite" else PostgresSide(location)


async def copy_inbox(options: CopyOptions, say: Say) -> CopyReport:
    """Copy (or, for a dry run, count) every table of the source into the target."""
    started = time.monotonic()
    source, target = open_side(options.source), open_side(options.target)
    try:
        await source.open()
        if isinstance(source, SqliteSide):
            _warn_if_served(source, say)
        _check_version(options.source, await source.version())
        source_tables = await source.tables()
        kind = options.source.kind
        plans = plan(kind, source_tables, kind, source_tables)  # the source is a whole inbox
        target_version = await _open_target(target)
        report = CopyReport(options, target_version)
        creating = target_version == 0
        if not creating and not options.append:
            full = await target.first_rows(list(KNOWN_TABLES))
            if full is not None:
                raise StoreError(
                    f"{options.target.named} already holds an inbox (table {full} has rows); "
                    "give --append to add only what it lacks, or name an empty target"
                )
        if creating and not options.dry_run:
            await target.close()
            await _create(options.target)
            target = open_side(options.target)
            await target.open()
        if not (creating and options.dry_run):  # (else there is no target to read yet)
            plans = plan(
                kind,
                source_tables,
                options.target.kind,
                await target.tables(),
                rowids=creating or not options.append,
            )
        await source.snapshot()
        for table_plan in plans:
            report.tables.append(TableCopy(table_plan.name, await source.count(table_plan.name)))
        if options.dry_run:
            await _dry_run(source, target, plans, report, appending=not creating)
        else:
            await target.prepare_writes()
            await _copy(source, target, plans, report, say)
            await target.finish([p.target for p in plans])
            await _verify(source, target, plans, report, say)
    finally:
        await source.close()
        await target.close()
    report.seconds = time.monotonic() - started
    return report


def _warn_if_served(source: SqliteSide, say: Say) -> None:
    for pid, command in serving_processes(source.path):
        say(
            f"warning: process {pid} ({command}) has the source inbox open: the copy holds the "
            "inbox as it is now, not what that process stores from now on; to move an inbox, "
            "stop its receiver first"
        )


def _check_version(location: Location, version: int) -> None:
    if version == SCHEMA_VERSION:
        return
    if version > SCHEMA_VERSION:
        raise StoreNewer(location.named, version, SCHEMA_VERSION)
    if version == 0:
        raise StoreUnavailable(f"{location.named} holds no inbox (it has no receiver schema)")
    raise _behind(location, version)


def _behind(location: Location, version: int) -> StoreUnavailable:
    return StoreUnavailable(
        f"{location.named} has schema version {version}, this release ({__version__}) copies "
        f"inboxes at version {SCHEMA_VERSION}: run `receiver migrate` on it first (a config "
        "whose store.url names it), then copy again"
    )


async def _open_target(target: SqliteSide | PostgresSide) -> int:
    """Open the target; its schema version (0: no inbox yet, a new file or an empty schema)."""
    if isinstance(target, SqliteSide) and not target.path.exists():
        return 0
    await target.open()
    version = await target.version()
    if version > SCHEMA_VERSION:
        raise StoreNewer(target.location.named, version, SCHEMA_VERSION)
    if 0 < version < SCHEMA_VERSION:
        raise _behind(target.location, version)
    return version


async def _create(location: Location) -> None:
    """Give the target this release's schema, as ``receiver migrate`` does."""
    from receiver.store.migrate import migrate_store

    try:
        await migrate_store(location.settings)
    except StoreError as exc:
        raise StoreUnavailable(f"{location.option}: {exc.message}") from exc


async def _dry_run(
    source: Side, target: Side, plans: Sequence[TablePlan], report: CopyReport, *, appending: bool
) -> None:
    for table_plan, done in zip(plans, report.tables, strict=True):
        done.read = done.rows
        if not appending:
            done.written = done.rows
            continue
        check = await compare_keys(
            source, table_plan.source, target, table_plan.target, batch=report.options.batch
        )
        done.written, done.skipped = check.missing, check.source_rows - check.missing


async def _copy(
    source: Side, target: Side, plans: Sequence[TablePlan], report: CopyReport, say: Say
) -> None:
    progress = Progress(say)
    for table_plan, done in zip(plans, report.tables, strict=True):
        progress.start()
        await _copy_table(
            source,
            target,
            table_plan,
            done,
            report.options.batch,
            progress,
            skip_existing=report.options.append,
        )


async def _copy_table(
    source: Side,
    target: Side,
    table_plan: TablePlan,
    done: TableCopy,
    batch: int,
    progress: Progress,
    *,
    skip_existing: bool,
) -> None:
    """Page through one table in key order; the next page is read while this one is written."""
    columns = [pair.source for pair in table_plan.pairs]
    written = [pair.target for pair in table_plan.pairs]
    positions = table_plan.key_positions

    def read(after: Key | None) -> asyncio.Future[list[Sequence[Any]]]:
        return asyncio.ensure_future(
            source.page(table_plan.name, columns, table_plan.key, after, batch)
        )

    pending: asyncio.Future[list[Sequence[Any]]] | None = read(None)
    try:
        while pending is not None:
            rows = await pending
            pending = None
            if len(rows) == batch:
                pending = read(tuple(rows[-1][n] for n in positions))
            if not rows:
                break
            values, leases = _prepared(table_plan, rows)
            inserted = await target.write(
                table_plan.target, written, values, skip_existing=skip_existing
            )
            done.read += len(rows)
            done.written += inserted
            done.skipped += len(rows) - inserted
            done.leases += leases
            progress.tick(table_plan.name, done.read, done.rows)
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StoreError):
                await pending


async def _verify(
    source: Side, target: Side, plans: Sequence[TablePlan], report: CopyReport, say: Say
) -> None:
    progress = Progress(say)
    for table_plan, done in zip(plans, report.tables, strict=True):
        progress.start()
        done.check = await compare_keys(
            source,
            table_plan.source,
            target,
            table_plan.target,
            batch=report.options.batch,
            progress=progress.counter(f"{done.name} keys checked", done.rows),
        )


def _prepared(table_plan: TablePlan, rows: Sequence[Sequence[Any]]) -> tuple[list[Any], int]:
    """A page's rows as columns ready to write, and how many leases were cleared."""
    values: list[Any] = list(zip(*rows, strict=True))
    leases = 0
    holder = table_plan.lease_position
    if holder is not None:
        leases = sum(v is not None for v in values[holder])
    for n, pair in enumerate(table_plan.pairs):
        if pair.cleared:
            values[n] = [None] * len(rows)
        elif pair.convert is not None:
            values[n] = pair.convert(values[n])
    return values, leases


class Progress:
    """``table: rows done / total, rate`` lines, at most one every :data:`PROGRESS_SECONDS`."""

    def __init__(self, say: Say) -> None:
        self.say = say
        self.last = time.monotonic()
        self.began = self.last

    def start(self) -> None:
        self.began = time.monotonic()

    def counter(self, what: str, total: int) -> Callable[[int], None]:
        """A callback taking how many of ``total`` are done."""
        return lambda done: self.tick(what, done, total)

    def tick(self, table: str, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_SECONDS:
            return
        self.last = now
        rate = done / max(now - self.began, 1e-9)
        share = f" ({100 * done // total}%)" if total else ""
        self.say(f"{table}: {done:,} / {total:,} rows{share}, {rate:,.0f} rows/s")
