"""bench-scale part 3's two sides: each an inbox of expired events (a SQLite file, or a schema
in a Postgres database of its own) served by ``--role intake`` and ``--role worker``, and
stopped (SIGSTOP) while the other side is measured.

A stopped side holds nothing the measured one needs: its processes and its inbox are its own,
on Postgres in a database of its own (a schema would not do: a process stopped inside a
transaction holds back the removal of dead rows in its whole database, the xmin horizon, and
the other side's deleted rows would pile up in its indexes).

The prune side's retention loop times its steps with the monotonic clock, which runs on while
the process is stopped, and waits four times what a step took after it
(receiver.ops.retention): stopped in the middle of a step, it would sleep four times the stop
once resumed. So it is stopped just after a step ends (its counters move), inside that wait.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench import backlog, metrics
from bench.common import Server, bench_env, free_port, receiver_command, receiver_config
from bench.ingest.__main__ import POSTGRES_URL
from bench.scale import postgres
from receiver.store.retention_timing import BENCH_ENV as RETENTION_ENV

KEEP_ALL_SECONDS = 1_000_000_000
#: [store].retention_hours's default, which the prune side runs with.
RETENTION_HOURS = 168.0
RECEIVED_HOURS_AGO = 200.0
PRUNED_METRIC = "receiver_inbox_pruned_events_total"
#: Moves after each step of giving free pages back (SQLite), as the other after a prune step.
VACUUMED_METRIC = "receiver_inbox_vacuumed_bytes_total"
#: How long stopping the prune side waits for a step to end (then stops it all the same).
STEP_WAIT_SECONDS = 2.0
#: Two steps' ends at least this many polls apart: the wait after a step (4/5 of that) outlasts
#: the two polls it may take to see it ended.
STEP_POLLS = 10


def pruned_events(admin_port: int) -> int | None:
    """The process's ``receiver_inbox_pruned_events_total``; None when it has none (or does
    not answer)."""
    text = metrics.scrape(admin_port)
    value = None if text is None else metrics.sums(text, PRUNED_METRIC).get(PRUNED_METRIC)
    return None if value is None else int(value)


def retention_steps(admin_port: int) -> float | None:
    """What moves after every step of the retention loop (events pruned + bytes given back);
    None without those counters."""
    text = metrics.scrape(admin_port, timeout=1.0)
    found = {} if text is None else metrics.sums(text, PRUNED_METRIC, VACUUMED_METRIC)
    return sum(found.values()) if found else None


def after_a_step(admin_port: int, budget: float = STEP_WAIT_SECONDS) -> bool:
    """Returns as soon as a step of the worker's retention loop has ended with time to stop it
    in the wait after that step (True), or after ``budget`` seconds without one (False: not
    pruning now, or no counters).

    The loop waits four times what a step took after it, so the time between two steps' ends
    (a step and the wait before it) is about five times a step: it must be STEP_POLLS polls or
    more, or the wait might end before the step's end is seen (the first steps are small)."""
    value = retention_steps(admin_port)
    if value is None:
        return False
    changed_at: float | None = None
    deadline = time.monotonic() + budget
    while (polled := time.monotonic()) < deadline:
        now_value = retention_steps(admin_port)
        now = time.monotonic()
        if now_value is not None and now_value != value:
            if changed_at is not None and now - changed_at >= STEP_POLLS * (now - polled):
                return True
            changed_at, value = now, now_value
    return False


@dataclass
class Side:
    """One inbox and its two processes, which may be stopped while the other side runs."""

    name: str
    intake: Server
    worker: Server
    admin_port: int  # the worker's ops listener
    prunes: bool  # its worker has the backlog to prune
    db: Path | None = None  # SQLite
    schema: str | None = None  # Postgres
    url: str = POSTGRES_URL  # Postgres: the url of the side's database
    database: str | None = None  # the side's own database, made for the run
    #: Held while the worker's /metrics is read, and while the side is stopped or resumed.
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped_since: float | None = None
    #: (from, to) of every stop, monotonic.
    stops: list[tuple[float, float]] = field(default_factory=list)
    #: Stops that found no step ending within STEP_WAIT_SECONDS.
    stopped_unaligned: int = 0

    def start(self) -> None:
        try:
            self.intake.start()
            self.worker.start(timeout=60)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self.resume()  # a stopped process acts on SIGTERM only once it runs again
        self.worker.stop()
        self.intake.stop()

    def pause(self) -> None:
        """Stop both processes (SIGSTOP); a side that prunes, right after a retention step."""
        with self.lock:
            if self.stopped_since is not None:
                return
            if self.prunes and not after_a_step(self.admin_port):
                self.stopped_unaligned += 1
            for server in (self.intake, self.worker):
                if server.proc is not None and server.proc.poll() is None:
                    os.kill(server.pid(), signal.SIGSTOP)
            self.stopped_since = time.monotonic()

    def resume(self) -> None:
        with self.lock:
            if self.stopped_since is None:
                return
            for server in (self.worker, self.intake):
                if server.proc is not None and server.proc.poll() is None:
                    os.kill(server.pid(), signal.SIGCONT)
            self.stops.append((self.stopped_since, time.monotonic()))
            self.stopped_since = None

    @property
    def running(self) -> bool:
        return self.stopped_since is None

    def stopped_seconds(self, since: float, until: float) -> float:
        """How long the side was stopped between two monotonic times."""
        stops = [*self.stops]
        if self.stopped_since is not None:
            stops.append((self.stopped_since, until))
        return sum(max(0.0, min(end, until) - max(start, since)) for start, end in stops)

    def running_seconds(self, since: float, until: float) -> float:
        """How long the side ran (was not stopped) between two monotonic times."""
        return until - since - self.stopped_seconds(since, until)

    def counts(self) -> tuple[int, int]:
        """(events, events past the default retention) in the inbox."""
        cutoff = time.time() - RETENTION_HOURS * 3600
        if self.schema is not None:
            return asyncio.run(_postgres_counts(self.url, self.schema, cutoff))
        uri = f"file:{self.db}?mode=ro"
        with closing(sqlite3.connect(uri, uri=True, timeout=30)) as conn:
            total, expired = conn.execute(
                "SELECT count(*), coalesce(sum(state = 'done' AND received_at < ?), 0) FROM events",
                (cutoff,),
            ).fetchone()
        return int(total), int(expired)

    def remove_inbox(self) -> None:
        """Drops the side's Postgres database (or schema, in the shared one)."""
        if self.database is not None:
            postgres.drop_database(POSTGRES_URL, self.database)
        elif self.schema is not None:
            postgres.drop(POSTGRES_URL, self.schema)


@contextmanager
def alone(side: Side, others: list[Side]) -> Iterator[None]:
    """``side`` runs alone: the others stopped, and resumed afterwards."""
    side.resume()
    for other in others:
        other.pause()
    try:
        yield
    finally:
        for other in others:
            other.resume()


async def _postgres_counts(url: str, schema: str, cutoff: float) -> tuple[int, int]:
    import asyncpg

    conn = await asyncpg.connect(url, server_settings={"search_path": schema})
    try:
        row = await conn.fetchrow(
            "SELECT count(*), count(*) FILTER (WHERE state = 'done' AND received_at < $1)"
            " FROM events",
            cutoff,
        )
    finally:
        await conn.close()
    return int(row[0]), int(row[1])


def make_side(
    args: argparse.Namespace, work: Path, kind: str, name: str, stub_port: int, *, keep_all: bool
) -> Side:
    """The inbox of ``--stored`` events received RECEIVED_HOURS_AGO, and its two processes
    (not started); ``keep_all``: the baseline, which prunes none of them."""
    directory = work / name
    directory.mkdir()
    # The same in the config: a receiver without the knob does not prune the baseline either.
    retention = {"retention_hours": KEEP_ALL_SECONDS / 3600} if keep_all else {}
    db: Path | None = None
    schema: str | None = None
    database, url = None, POSTGRES_URL
    if kind == "postgres":
        made = postgres.new_database(POSTGRES_URL)
        if made is None:
            print(
                f"  note: the {name} side's schema in the shared database: stopped, it may hold "
                "back the removal of the other side's dead rows"
            )
        else:
            database, url = made
        schema = postgres.build(url, args.stored, directory, received_hours_ago=RECEIVED_HOURS_AGO)
        store: dict[str, object] = {"url": url, "schema": schema, **retention}
    else:
        db = backlog.cached_copy(
            f"inbox-{args.stored}-done.db",
            args.stored,
            directory / "inbox.db",
            state="done",
            body=backlog.image_event,
            received_hours_ago=RECEIVED_HOURS_AGO,
        )
        store = {"url": f"sqlite:///{db}", "synchronous": "full", **retention}
    sink = {
        "name": "forward",
        "type": "http",
        "url": f"http://127.0.0.1:{stub_port}/capture",
        "secret": "whsec_bench_forward",
    }
    env = bench_env()
    if keep_all:
        env[RETENTION_ENV] = str(KEEP_ALL_SECONDS)
    port = free_port()
    servers: dict[str, Server] = {}
    admin_port = 0
    for role in ("intake", "worker"):
        role_dir = directory / role
        role_dir.mkdir()
        admin_port = free_port()
        config = receiver_config(
            role_dir,
            port=port,
            admin_port=admin_port,
            base_url=f"http://127.0.0.1:{stub_port}/v1",
            sinks=[sink],
            store=store,
        )
        server = Server(
            f"{name}-{role}",
            receiver_command(config, role, args.loop),
            port=port if role == "intake" else admin_port,
            cwd=role_dir,
            env=env,
        )
        if not keep_all:
            server.env.pop(RETENTION_ENV, None)  # not even from this run's own environment
        servers[role] = server
    return Side(
        name,
        servers["intake"],
        servers["worker"],
        admin_port,
        prunes=not keep_all,
        db=db,
        schema=schema,
        url=url,
        database=database,
    )
