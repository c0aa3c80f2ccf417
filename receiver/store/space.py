"""What an inbox takes on disk, as the retention loop and the metrics see it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InboxSpace:
    """``file_bytes``: the inbox's size on disk (SQLite: the database file and its WAL; Postgres:
    its tables with their indexes). ``free_bytes``: pages inside it that hold nothing (SQLite's
    free list), which new rows reuse and an incremental vacuum gives back; None where the
    backend does not say. ``reclaimable``: whether :meth:`~receiver.store.base.Store.reclaim_space`
    has anything to do: SQLite can give free pages back (a file made before incremental vacuum
    cannot, until ``receiver store vacuum`` converts it); Postgres vacuums when the server's
    autovacuum is off (``free_bytes`` None: in one go). ``index_bytes``: the part of
    ``file_bytes`` that is indexes, and ``cache_bytes``: the database server's buffer cache
    (Postgres: ``shared_buffers``); None where the backend does not say. Indexes keyed by random
    ids are written all over, so once they outgrow that cache each webhook costs the server
    more (see docs/postgres.md)."""

    file_bytes: int
    free_bytes: int | None = None
    reclaimable: bool = False
    index_bytes: int | None = None
    cache_bytes: int | None = None
