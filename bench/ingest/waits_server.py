"""``receiver serve`` with time stamps on every webhook and group commit, for bench.ingest.waits.

Wraps, in this process's memory only, the receiver's own objects, then runs ``receiver serve``
exactly as the ``receiver`` command does (:func:`receiver.cli.main`):

- ``Intake.handle``: the request's number, and when the handler started and returned;
- ``GroupCommit.submit``: when the request's event was handed to the store;
- ``SqliteStore._write_adds``: when its group was formed (taken from the queue) and when the
  store's write returned (after the checkpoint it may run between two groups);
- ``write_group`` (the store's call of it): when the writer's turn was held and the group handed
  to the intake connection's thread, and when the loop got the result back;
- ``_write_group`` (on that thread): when the transaction began and when its COMMIT returned;
- aiohttp's ``RequestHandler.finish_response``: when the response was written to the socket;
- and each garbage collection's generation, start and end (``gc.callbacks``), during which the
  event loop's thread does nothing else. ``--no-gc-freeze`` leaves out what ``receiver serve``
  does at start to make the full ones short (:func:`receiver.server.freeze_startup_objects`).

Stamps are ``time.perf_counter()`` values in arrays allocated at start (``--capacity`` requests
and as many groups): no logging, no allocation that lives on, per request. SIGUSR1 records a mark
(the request and group counts and the time) so the benchmark can tell its rounds apart; when
``receiver serve`` returns (after SIGTERM) every stamp is written as JSON to ``--stamps``::

    python -m bench.ingest.waits_server --stamps FILE [--capacity N] [--no-gc-freeze] \\
        serve --config C --role intake
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
import sys
import time
from array import array
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any

#: Each request's stamps (seconds, perf_counter), by request number.
REQUEST_STAMPS = ("handled", "submitted", "returned", "sent")
#: Each group's stamps, by group number: formed (``_write_adds`` called), turn (the writer's
#: turn held, handed to the connection's thread), begun and committed (on that thread), back (the
#: loop has the result) and done (``_write_adds`` returned).
GROUP_STAMPS = ("formed", "turn", "begun", "committed", "back", "done")

# The request the running task handles (set in Intake.handle; aiohttp runs each request in a
# task of its own, whose context finish_response shares), and the group the flusher writes.
_request: ContextVar[int] = ContextVar("bench_waits_request", default=-1)
_group: ContextVar[int] = ContextVar("bench_waits_group", default=-1)


class Stamps:
    """Preallocated stamp arrays; ``count`` requests and ``groups`` groups stamped so far."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        zeros = bytes(8 * capacity)
        self.requests = {name: array("d", zeros) for name in REQUEST_STAMPS}
        self.groups = {name: array("d", zeros) for name in GROUP_STAMPS}
        self.group_of = array("q", [-1]) * capacity  # each request's group
        self.status = array("H", bytes(2 * capacity))  # each response's status
        self.size = array("I", bytes(4 * capacity))  # each group's events
        self.count = 0
        self.group_count = 0
        self.dropped = 0  # requests past the capacity, not stamped
        self.marks: list[tuple[int, int, float]] = []
        self.collections: list[tuple[int, float, float]] = []  # (generation, start, end)
        self._collecting = 0.0
        self.waiting: dict[int, int] = {}  # id(item submitted) -> request, until its group forms
        self.handed: dict[int, int] = {}  # id(group's list) -> group, until its thread takes it

    def mark(self) -> None:
        self.marks.append((self.count, self.group_count, time.perf_counter()))

    def on_collection(self, phase: str, info: dict[str, int]) -> None:
        """A ``gc.callbacks`` entry: each collection's generation and its start and end."""
        if phase == "start":
            self._collecting = time.perf_counter()
        else:
            self.collections.append((info["generation"], self._collecting, time.perf_counter()))

    def dump(self, path: Path) -> None:
        n, g = self.count, self.group_count
        data = {
            "capacity": self.capacity,
            "dropped": self.dropped,
            "marks": self.marks,
            "collections": self.collections,
            "requests": {name: stamps[:n].tolist() for name, stamps in self.requests.items()},
            "group_of": self.group_of[:n].tolist(),
            "status": self.status[:n].tolist(),
            "groups": {name: stamps[:g].tolist() for name, stamps in self.groups.items()},
            "size": self.size[:g].tolist(),
        }
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)


def install(stamps: Stamps) -> None:
    """Wrap the receiver's objects (this process only); fails loudly if one is gone."""
    from aiohttp.web_protocol import RequestHandler

    import receiver.store.sqlite.intake as sqlite_intake
    import receiver.store.sqlite.store as sqlite_store
    from receiver.intake.endpoint import Intake
    from receiver.store.batching import GroupCommit

    clock = time.perf_counter
    handle = Intake.handle
    submit = GroupCommit.submit
    write_adds = sqlite_store.SqliteStore._write_adds
    write_group = sqlite_intake.write_group  # what the store module imported
    thread_write_group = sqlite_intake._write_group
    finish_response = RequestHandler.finish_response
    handled, submitted = stamps.requests["handled"], stamps.requests["submitted"]
    returned, sent = stamps.requests["returned"], stamps.requests["sent"]
    formed, turn, begun = stamps.groups["formed"], stamps.groups["turn"], stamps.groups["begun"]
    committed, back, done = stamps.groups["committed"], stamps.groups["back"], stamps.groups["done"]
    group_of, status, size = stamps.group_of, stamps.status, stamps.size
    waiting, handed = stamps.waiting, stamps.handed

    async def timed_handle(self: Intake, request: Any) -> Any:
        i = stamps.count
        if i >= stamps.capacity:
            stamps.dropped += 1
            return await handle(self, request)
        stamps.count = i + 1
        handled[i] = clock()
        _request.set(i)
        response = await handle(self, request)
        returned[i] = clock()
        status[i] = response.status
        return response

    def timed_submit(self: GroupCommit[Any, Any], item: Any) -> Any:
        i = _request.get()
        if i >= 0:
            submitted[i] = clock()
            waiting[id(item)] = i
        return submit(self, item)

    async def timed_write_adds(self: Any, adds: list[Any]) -> Any:
        g = stamps.group_count
        if g >= stamps.capacity:
            return await write_adds(self, adds)
        stamps.group_count = g + 1
        formed[g] = clock()
        size[g] = len(adds)
        for add in adds:
            i = waiting.pop(id(add), -1)
            if i >= 0:
                group_of[i] = g
        _group.set(g)
        try:
            return await write_adds(self, adds)
        finally:
            done[g] = clock()
            _group.set(-1)

    async def timed_write_group(conn: Any, adds: list[Any], path: Path) -> Any:
        g = _group.get()
        if g < 0:
            return await write_group(conn, adds, path)
        turn[g] = clock()
        handed[id(adds)] = g
        try:
            return await write_group(conn, adds, path)
        finally:
            back[g] = clock()
            handed.pop(id(adds), None)

    def timed_thread_write_group(conn: Any, adds: list[Any], path: Path) -> Any:
        g = handed.get(id(adds), -1)
        if g < 0:
            return thread_write_group(conn, adds, path)
        begun[g] = clock()
        try:
            return thread_write_group(conn, adds, path)
        finally:
            committed[g] = clock()

    async def timed_finish_response(self: Any, request: Any, resp: Any, start: Any) -> Any:
        result = await finish_response(self, request, resp, start)
        i = _request.get()
        if i >= 0:
            sent[i] = clock()
        return result

    patches: list[tuple[Any, str, Callable[..., Any]]] = [
        (Intake, "handle", timed_handle),
        (GroupCommit, "submit", timed_submit),
        (sqlite_store.SqliteStore, "_write_adds", timed_write_adds),
        (sqlite_store, "write_group", timed_write_group),
        (sqlite_intake, "_write_group", timed_thread_write_group),
        (RequestHandler, "finish_response", timed_finish_response),
    ]
    for owner, name, wrapper in patches:
        getattr(owner, name)  # AttributeError if the receiver (or aiohttp) renamed it
        setattr(owner, name, wrapper)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stamps", type=Path, required=True, help="JSON written at exit")
    parser.add_argument("--capacity", type=int, default=500_000, help="requests (and groups)")
    parser.add_argument(
        "--no-gc-freeze", action="store_true", help="leave the objects made at start collectable"
    )
    parser.add_argument("receiver", nargs=argparse.REMAINDER, help="receiver's arguments")
    args = parser.parse_args(argv)
    stamps = Stamps(args.capacity)
    install(stamps)
    gc.callbacks.append(stamps.on_collection)
    if args.no_gc_freeze:
        import receiver.server

        receiver.server.freeze_startup_objects = lambda: None
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: stamps.mark())

    from receiver.cli import main as receiver_main

    try:
        return receiver_main(args.receiver)
    finally:
        stamps.dump(args.stamps)


if __name__ == "__main__":
    sys.exit(main())
