"""The soak's samples: the receiver's RSS and open fds (/proc), the SQLite files' sizes, the
inbox's figures from its /metrics and, on Postgres, the schema's tables; one every few seconds."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench import metrics
from bench.common import machine_note
from bench.proc import open_fds, rss_mb, socket_ports
from bench.soak.figures import bloat, mib, na
from bench.soak.postgres_stats import PG_TABLES, pg_tables
from bench.soak.traffic import Traffic

SQLITE_FILES = {"db": "inbox.db", "wal": "inbox.db-wal", "shm": "inbox.db-shm"}
EVENTS = "receiver_inbox_events"
PRUNED = "receiver_inbox_pruned_events_total"
FILE_BYTES = "receiver_inbox_file_bytes"
FREE_BYTES = "receiver_inbox_free_bytes"
VACUUMED = "receiver_inbox_vacuumed_bytes_total"


@dataclass
class Sample:
    """One sample of the receiver and its store; None where not measured (or not exported)."""

    store: str
    t: float  # seconds since the traffic started
    sent: int
    ok: int
    non_2xx: int
    errors: int
    rss_mib: float
    fds: int
    fds_sockets: int
    #: The sockets by peer: webhooks and admin (connections to the receiver's ports, held by
    #: the sender's and the sampler's pools), upstream (to the stub: the upstream API and the
    #: http sink), db (to PostgreSQL), other (listening sockets among them).
    sockets_webhooks: int = 0
    sockets_admin: int = 0
    sockets_upstream: int = 0
    sockets_db: int = 0
    sockets_other: int = 0
    events: int | None = None
    pending: int | None = None
    done: int | None = None
    dead: int | None = None
    pruned_total: float | None = None
    vacuumed_bytes_total: float | None = None
    metric_file_bytes: float | None = None
    metric_free_bytes: float | None = None
    # SQLite
    db_bytes: int | None = None
    wal_bytes: int | None = None
    shm_bytes: int | None = None
    file_bytes: int | None = None
    # Postgres: every table of the schema, then events and deliveries
    pg_bytes: int | None = None
    pg_live: int | None = None
    pg_dead: int | None = None
    pg_events_bytes: int | None = None
    pg_events_live: int | None = None
    pg_events_dead: int | None = None
    pg_events_last_autovacuum: str | None = None
    pg_deliveries_bytes: int | None = None
    pg_deliveries_live: int | None = None
    pg_deliveries_dead: int | None = None
    pg_deliveries_last_autovacuum: str | None = None
    load1: float = 0.0
    load5: float = 0.0
    load15: float = 0.0
    #: Taken while the traffic ran (the last sample, after it, has the sender's connections closed).
    during_traffic: bool = True
    #: machine_note() when the sample was taken (not in the CSV).
    note: str = field(default="", repr=False)

    @property
    def size(self) -> int | None:
        """The store's bytes on disk: the SQLite files, or the schema's tables."""
        return self.file_bytes if self.store == "sqlite" else self.pg_bytes


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def read_metrics(text: str, sample: Sample) -> None:
    """The inbox's gauges and counters from a /metrics page into ``sample`` (absent: None)."""
    states = metrics.by_label(text, EVENTS, "state")
    sums = metrics.sums(text, PRUNED, FILE_BYTES, FREE_BYTES, VACUUMED)
    if states:
        sample.events = int(sum(states.values()))
        sample.pending = int(states.get("pending", 0))
        sample.done = int(states.get("done", 0))
        sample.dead = int(states.get("dead", 0))
    sample.pruned_total = sums.get(PRUNED)
    sample.metric_file_bytes = sums.get(FILE_BYTES)
    sample.metric_free_bytes = sums.get(FREE_BYTES)
    sample.vacuumed_bytes_total = sums.get(VACUUMED)


def read_pg(tables: dict[str, dict[str, Any]], sample: Sample) -> None:
    """The schema's tables (postgres_stats.pg_tables) into ``sample``."""
    sample.pg_bytes = sum(t["bytes"] for t in tables.values())
    sample.pg_live = sum(t.get("live", 0) for t in tables.values())
    sample.pg_dead = sum(t.get("dead", 0) for t in tables.values())
    for name in PG_TABLES:
        table = tables.get(name, {})
        setattr(sample, f"pg_{name}_bytes", table.get("bytes"))
        setattr(sample, f"pg_{name}_live", table.get("live"))
        setattr(sample, f"pg_{name}_dead", table.get("dead"))
        last = table.get("last_autovacuum")
        setattr(sample, f"pg_{name}_last_autovacuum", last.isoformat() if last else None)


def sockets(s: Sample) -> str:
    """A sample's sockets by peer, e.g. ``webhooks 40, admin 1, upstream 12, db 10, other 2``."""
    return (
        f"webhooks {s.sockets_webhooks}, admin {s.sockets_admin}, upstream {s.sockets_upstream}, "
        f"db {s.sockets_db}, other {s.sockets_other}"
    )


def progress(s: Sample) -> str:
    """A sample's line, printed as it is taken."""
    size = mib(s.size)
    if s.store == "sqlite":
        size = (
            f"files {size} (wal {mib(s.wal_bytes)}, free {mib(s.metric_free_bytes)}, "
            f"vacuumed {mib(s.vacuumed_bytes_total)})"
        )
    else:
        size = f"tables {size} (dead/live {bloat(s.pg_dead, s.pg_live)})"
    return (
        f"{s.t:6.0f} s  sent {s.sent:,}  events {na(s.events)} (pending {na(s.pending)})  "
        f"{size}  RSS {s.rss_mib:.1f} MiB  fds {s.fds} ({s.fds_sockets} sockets: {sockets(s)})  "
        f"pruned {na(s.pruned_total)}  load {s.load1:.2f}"
    )


class Sampler:
    """Takes the samples of one store's run."""

    def __init__(
        self,
        store: str,
        *,
        pid: int,
        directory: Path,
        metrics_url: str,
        traffic: Traffic,
        loop_name: str,
        ports: dict[str, int | None] | None = None,
        pg: Any = None,
        schema: str | None = None,
    ) -> None:
        self.store = store
        self.pid = pid
        self.directory = directory
        self.metrics_url = metrics_url
        self.traffic = traffic
        self.loop_name = loop_name
        #: webhooks, admin (the receiver's ports), upstream (the stub's), db (PostgreSQL's).
        self.ports = ports or {}
        self.pg = pg
        self.schema = schema
        self.samples: list[Sample] = []
        #: The schema's tables at the last sample (postgres_stats.pg_tables).
        self.pg_last: dict[str, dict[str, Any]] = {}

    async def take(
        self, session: aiohttp.ClientSession, t: float, *, during_traffic: bool = True
    ) -> Sample:
        load = os.getloadavg()
        traffic = self.traffic
        fds, socket_count = open_fds(self.pid)
        sample = Sample(
            store=self.store,
            t=round(t, 1),
            sent=traffic.sent,
            ok=traffic.ok,
            non_2xx=traffic.non_2xx,
            errors=traffic.failed,
            rss_mib=round(rss_mb(self.pid), 1),
            fds=fds,
            fds_sockets=socket_count,
            load1=round(load[0], 2),
            load5=round(load[1], 2),
            load15=round(load[2], 2),
            note=machine_note(self.loop_name),
            during_traffic=during_traffic,
        )
        self.count_sockets(sample)
        if self.store == "sqlite":
            sizes = {k: file_size(self.directory / name) for k, name in SQLITE_FILES.items()}
            sample.db_bytes, sample.wal_bytes, sample.shm_bytes = (
                sizes["db"],
                sizes["wal"],
                sizes["shm"],
            )
            sample.file_bytes = sum(sizes.values())
        try:
            async with session.get(self.metrics_url) as response:
                read_metrics(await response.text(), sample)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            print(f"    note: /metrics not read at {t:.0f} s: {exc!r}")
        if self.pg is not None and self.schema is not None:
            try:
                self.pg_last = await pg_tables(self.pg, self.schema)
                read_pg(self.pg_last, sample)
            except Exception as exc:  # asyncpg's errors, a lost connection: the sample goes on
                print(f"    note: the schema's tables not read at {t:.0f} s: {exc!r}")
        self.samples.append(sample)
        print("    " + progress(sample), flush=True)
        return sample

    def count_sockets(self, sample: Sample) -> None:
        """The receiver's TCP sockets by peer (see :class:`Sample`)."""
        local = {self.ports.get("webhooks"): "webhooks", self.ports.get("admin"): "admin"}
        remote = {self.ports.get("upstream"): "upstream", self.ports.get("db"): "db"}
        for local_port, remote_port in socket_ports(self.pid):
            # A listening socket (no remote port) is "other".
            name = (remote.get(remote_port) or local.get(local_port)) if remote_port else None
            attribute = f"sockets_{name or 'other'}"
            setattr(sample, attribute, getattr(sample, attribute) + 1)

    async def run(self, every: float, seconds: float, sender: asyncio.Task[None]) -> None:
        """A sample at 0, every ``every`` seconds, and once the traffic has ended."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            k = 0
            while (due := k * every) < seconds - every / 10:
                if (delay := start + due - loop.time()) > 0:
                    await asyncio.sleep(delay)
                if sender.done():
                    break
                await self.take(session, loop.time() - start)
                k += 1
            await sender  # the traffic's end (its exception, if any)
            await self.take(session, loop.time() - start, during_traffic=False)
