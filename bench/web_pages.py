"""Inbox page timings with a million events stored in SQLite.

Builds (once, cached under .bench/cache) an inbox of ``--events`` events over a week: 90 %
``job.completed``, 10 % ``job.failed``; a ``files`` sink gets every event, ``slack`` only the
failed ones; 1 % end dead, 0.5 % are still pending. Then times whole pages, as a browser gets
them (HTTP request, store queries, template), from the inbox UI served in this process:

- the first events page, a page deep down the cursor chain (900,000 events in), and the page
  just newer than that one;
- filtered pages: by state, event name, sink and state, a job id, a one-hour window;
- the overview and the dead letters.

Each page is fetched ``--rounds`` times; the median and the worst are printed. Target: every
page under 100 ms. The query plans are printed too, to show each page reads an index range::

    python -m bench.web_pages [--events 1000000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import sqlite3
import time
import uuid
from contextlib import closing
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bench.backlog import LAYOUT, finish_inbox, insert_rows, new_inbox
from bench.common import ROOT, Table, machine_note, median
from receiver.config.settings import SinkSettings, StoreSettings
from receiver.observe.metrics import Metrics
from receiver.store.browse import Cursor, EventQuery
from receiver.store.sql.browse import browse_sql
from receiver.store.sqlite import MIGRATIONS, SqliteStore
from receiver.web import InboxUi

CACHE = ROOT / ".bench" / "cache"
CHUNK = 50_000
WEEK = 7 * 86400
TOKEN = "bench-token"
TARGET_MS = 100.0


def build(path: Path, count: int) -> None:
    """The inbox described in the module docstring, written in bulk with the receiver's schema."""
    rng = random.Random(7)
    started = time.monotonic()
    end = time.time() - 60
    begin = end - WEEK
    with closing(new_inbox(path)) as conn:
        for start in range(0, count, CHUNK):
            events, deliveries = [], []
            for n in range(start, min(count, start + CHUNK)):
                event_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
                job_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
                failed = rng.random() < 0.10
                name = "job.failed" if failed else "job.completed"
                received = begin + WEEK * n / count
                roll = rng.random()
                state = "dead" if roll < 0.01 else "pending" if roll < 0.015 else "done"
                body = json.dumps(
                    {
                        "id": event_id,
                        "object": "event",
                        "event": name,
                        "job_id": job_id,
                        "type": "image_generation",
                        "timestamp": received,
                    }
                ).encode()
                events.append(
                    (
                        event_id,
                        name,
                        job_id,
                        body,
                        "{}",
                        received,
                        state,
                        received if state == "pending" else None,
                    )
                )
                sinks = ("files", "slack") if failed else ("files",)
                for i, sink in enumerate(sinks):
                    # A dead event: its last sink died; a pending one: its last sink waits.
                    d_state = state if i == len(sinks) - 1 else "done"
                    error = "HTTP 503 from the consumer" if d_state == "dead" else None
                    deliveries.append(
                        (
                            event_id,
                            sink,
                            d_state,
                            1,
                            received + 60 if d_state == "pending" else None,
                            error,
                            received + 1,
                        )
                    )
            insert_rows(conn, events, deliveries)
            print(f"  {start + len(events):,} events ({time.monotonic() - started:.0f} s)")
        finish_inbox(conn)


def inbox(count: int) -> Path:
    """The cached inbox for ``count`` events, rebuilt whenever the schema's statements or the
    inbox's layout (backlog.LAYOUT) change."""
    schema = hashlib.sha256(repr(MIGRATIONS).encode()).hexdigest()[:10]
    path = CACHE / f"web-{count}-{schema}-{LAYOUT}.db"
    if not path.exists():
        print(f"building an inbox of {count:,} events at {path} (once; cached)")
        build(path, count)
    return path


def sample(path: Path) -> dict[str, str]:
    """Values the filtered pages use: a deep cursor, a job id, a window in the middle."""
    with closing(sqlite3.connect(path)) as conn:
        (total,) = conn.execute("SELECT count(*) FROM events").fetchone()
        deep_at, deep_id = conn.execute(
            "SELECT received_at, id FROM events ORDER BY received_at DESC, id DESC"
            " LIMIT 1 OFFSET ?",
            (int(total * 0.9),),
        ).fetchone()
        (job_id,) = conn.execute(
            "SELECT job_id FROM events ORDER BY received_at LIMIT 1 OFFSET ?", (total // 3,)
        ).fetchone()
        (middle,) = conn.execute(
            "SELECT received_at FROM events ORDER BY received_at LIMIT 1 OFFSET ?", (total // 2,)
        ).fetchone()
    cursor = Cursor(deep_at, deep_id).encode()
    return {"cursor": cursor, "job_id": job_id, "since": str(middle), "until": str(middle + 3600)}


def pages(v: dict[str, str]) -> list[tuple[str, str]]:
    return [
        ("events, first page", "/ui/events"),
        ("events, 900,000 in (cursor)", f"/ui/events?before={v['cursor']}"),
        ("events, newer than that", f"/ui/events?after={v['cursor']}"),
        ("state = dead", "/ui/events?state=dead"),
        ("state = dead, deep", f"/ui/events?state=dead&before={v['cursor']}"),
        ("event = job.failed", "/ui/events?event=job.failed"),
        ("event = job.failed, deep", f"/ui/events?event=job.failed&before={v['cursor']}"),
        ("sink = slack, state = dead", "/ui/events?sink=slack&state=dead"),
        ("sink = slack", "/ui/events?sink=slack"),
        ("sink = files, state = pending", "/ui/events?sink=files&state=pending"),
        ("job id", f"/ui/events?q={v['job_id']}"),
        ("one hour window", f"/ui/events?since={v['since']}&until={v['until']}"),
        ("pending + job.completed", "/ui/events?state=pending&event=job.completed"),
        ("overview", "/ui/"),
        ("dead letters", "/ui/dead"),
    ]


def print_plans(path: Path, v: dict[str, str]) -> None:
    cursor = Cursor.decode(v["cursor"])
    queries = {
        "first page": EventQuery(),
        "event name": EventQuery(event="job.failed"),
        "sink + state": EventQuery(sink="slack", state="dead"),
        "job id": EventQuery(ref=v["job_id"]),
        "window": EventQuery(since=float(v["since"]), until=float(v["until"])),
    }
    with closing(sqlite3.connect(path)) as conn:
        for name, query in queries.items():
            sql, params = browse_sql(query, before=cursor, after=None, limit=51)
            plan = conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
            print(f"  {name}: " + " | ".join(row[-1] for row in plan))


async def measure(path: Path, rounds: int) -> Table:
    store = SqliteStore(StoreSettings(url=f"sqlite:///{path}"))
    await store.open()
    metrics = Metrics()
    # As in `receiver serve`: the inbox gauges are refreshed every few seconds (whether anyone
    # looks or not) and the overview shows them; that refresh is timed on its own line.
    refresh_ms = []
    for _ in range(3):
        started = time.perf_counter()
        counts, _oldest = await store.counts()
        refresh_ms.append((time.perf_counter() - started) * 1000)
    for state, value in counts.items():
        metrics.inbox_events.labels(state).set(value)
    ui = InboxUi(
        store=store,
        metrics=metrics,
        sinks=[
            SinkSettings(name="files", type="download"),
            SinkSettings(name="slack", type="slack"),
        ],
        admin_token=TOKEN,
        admin_host="127.0.0.1",
    )
    app = web.Application()
    app.add_subapp("/ui/", ui.app())
    table = Table(["page", "median ms", "worst ms", "rows", "under 100 ms"])
    values = sample(path)
    try:
        async with TestClient(TestServer(app)) as client:
            response = await client.post("/ui/login", data={"token": TOKEN})
            assert response.status == 200, await response.text()
            for name, url in pages(values):
                times, rows = [], 0
                for _ in range(rounds):
                    started = time.perf_counter()
                    response = await client.get(url)
                    text = await response.text()
                    times.append((time.perf_counter() - started) * 1000)
                    assert response.status == 200, (url, text[:500])
                    rows = text.count('<td class="deliveries">')
                worst = max(times)
                table.add(
                    name,
                    f"{median(times):.1f}",
                    f"{worst:.1f}",
                    rows,
                    "yes" if worst < TARGET_MS else "NO",
                )
    finally:
        await store.close()
    table.add(
        "(inbox gauges refresh, every 5 s)",
        f"{median(refresh_ms):.1f}",
        f"{max(refresh_ms):.1f}",
        "",
        "",
    )
    print("query plans:")
    print_plans(path, values)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    path = inbox(args.events)
    print(f"inbox: {args.events:,} events, {path.stat().st_size / 1e6:.0f} MB")
    table = asyncio.run(measure(path, args.rounds))
    print()
    print(table.render())
    print(machine_note("asyncio"))


if __name__ == "__main__":
    main()
