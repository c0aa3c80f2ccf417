"""Intake's steps one by one, and its whole handler, in one process: time per webhook.

Each step is what ``Intake._handle`` does for one accepted webhook (a bench/common.py body of
about 800 bytes, signed as the upstream signs it), timed over many calls:

- ``read``: the body from a request whose body has all arrived, as intake reads it;
- ``signature``: parsing ``Service-Signature`` and the HMAC check, as intake calls it;
- ``parse``: the body's JSON and its checks (``parse_event``);
- ``event``: the event to store, with its kept headers;
- ``metrics``: the counters and the skew histogram an accepted webhook updates;
- ``answer``: the 2xx response object;
- ``handler``: ``Intake._handle`` whole, on a store that keeps nothing (as bench's no-store).

Times are the thread's CPU time (not wall time: another process taking the core does not
count), the fastest of a few passes of ``--count`` calls, per call.

aiohttp's own work around the handler (parsing the request, writing the response) is not here:
``python -m bench.ingest`` and ``python -m bench.ingest.profile`` measure the whole server.
With ``--previous CHECKOUT`` the same steps run on the receiver of another checkout (a
``git worktree`` of an older commit) too, alternating processes round by round::

    python -m bench.ingest.steps [--rounds 5] [--previous CHECKOUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

# No receiver import up here (bench.common imports it): a child measuring another checkout
# must import that checkout's receiver first.
ROOT = Path(__file__).resolve().parents[2]

STEPS = ("read", "signature", "parse", "event", "metrics", "answer", "handler")
REPEATS = 5


class _Connection:
    """What a request and its body stream ask of aiohttp's connection handler, and no more
    (a Mock's every attribute access costs microseconds, which would be timed)."""

    _reading_paused = False
    transport = None
    peername = ("127.0.0.1", 40000)
    sockname = ("127.0.0.1", 8080)
    ssl_context = None

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass


def _request(body: bytes, headers: dict[str, str]) -> Any:
    """A request as aiohttp hands it to the handler: headers parsed, the body all arrived."""
    from aiohttp import web
    from aiohttp.http_parser import RawRequestMessage
    from aiohttp.http_writer import HttpVersion11
    from aiohttp.streams import StreamReader
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    loop = asyncio.get_running_loop()
    connection = _Connection()
    stream = StreamReader(connection, 2**16, loop=loop)  # type: ignore[arg-type]
    stream.feed_data(body)
    stream.feed_eof()
    raw = tuple((k.encode(), v.encode()) for k, v in headers.items())
    message = RawRequestMessage(
        "POST",
        "/webhooks",
        HttpVersion11,
        CIMultiDictProxy(CIMultiDict(headers)),
        raw,
        False,
        None,
        False,
        False,
        URL("/webhooks"),
    )
    return web.Request(
        message,
        stream,
        connection,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        loop,
        client_max_size=2**20,
    )


async def _steps(count: int) -> dict[str, float]:
    from bench.common import SECRET, webhook_body
    from receiver import signature
    from receiver.config.load import parse_settings
    from receiver.intake import endpoint as intake
    from receiver.observe.metrics import Metrics
    from receiver.secrets import SecretBox
    from receiver.store.records import NewEvent

    body = webhook_body("steps")
    event_id = json.loads(body)["id"]
    now = time.time()
    header = signature.sign(SECRET, body, int(now))
    headers = signature.webhook_headers(
        SECRET, body, int(now), event_id=event_id, event_name="job.completed"
    )
    headers |= {"Content-Length": str(len(body)), "User-Agent": "upstream/1.0"}
    settings = parse_settings({"webhook": {"secrets": [SECRET]}}, env={})
    secrets = SecretBox(settings.webhook)
    metrics = Metrics()

    class KeepNothing:
        async def add_event(self, _event: Any) -> bool:
            return True

    handler = intake.Intake(
        settings=settings,
        store=KeepNothing(),  # type: ignore[arg-type]
        secrets=secrets,
        metrics=metrics,
    )
    if hasattr(signature, "check"):  # this checkout's intake: prepared keys, no result object

        def verify() -> Any:
            return signature.check(secrets.keys, body, header, now, 300)
    else:

        def verify() -> Any:
            return signature.verify(
                secrets=secrets.secrets, body=body, header=header, now=now, tolerance_seconds=300
            )

    counters = (
        metrics.webhook_requests.labels("accepted"),
        metrics.pull_events.labels("webhook"),
        metrics.events.labels("job.completed", "received"),
        metrics.secret_matches.labels("0"),
    )
    if all(hasattr(c, "value") for c in counters):  # plain numbers, added to in place

        def tally() -> None:
            for counter in counters:
                counter.value += 1
            metrics.signature_skew.observe(0.4)
    else:

        def tally() -> None:
            for counter in counters:
                counter.inc()
            metrics.signature_skew.observe(0.4)

    requests = [_request(body, headers) for _ in range(count)]
    request_headers = requests[0].headers
    read_body = getattr(handler, "_read_body", None)

    async def read(request: Any) -> Any:
        if read_body is not None:
            return await read_body(request)
        return await request.read()

    def event(_: Any) -> Any:
        return NewEvent(
            id=event_id,
            event="job.completed",
            job_id="job",
            body=body,
            headers={
                k: v for k in intake.KEPT_HEADERS if (v := request_headers.get(k)) is not None
            },
            received_at=now,
            sinks=("files",),
        )

    plain: dict[str, Callable[[Any], Any]] = {
        "signature": lambda _: verify(),
        "parse": lambda _: intake.parse_event(body),
        "event": event,
        "metrics": lambda _: tally(),
        "answer": lambda _: intake.accepted_response(event_id, duplicate=False),
    }
    awaited: dict[str, Callable[[Any], Awaitable[Any]]] = {
        "read": read,
        "handler": handler._handle,
    }
    result: dict[str, float] = {}
    for step in STEPS:
        best = float("inf")
        for _ in range(REPEATS):  # the fastest of a few passes: the others were interrupted
            if step in awaited:
                fresh = [_request(body, headers) for _ in range(count)]
                run = awaited[step]
                started = time.thread_time_ns()
                for request in fresh:
                    await run(request)
            else:
                call = plain[step]
                started = time.thread_time_ns()
                for request in requests:
                    call(request)
            best = min(best, (time.thread_time_ns() - started) / count)
        result[step] = best
    answer = await handler._handle(_request(body, headers))
    assert answer.status == 200, answer.text
    return result


def measure(checkout: str | None, count: int) -> dict[str, float]:
    """One round in a process of its own, on the receiver of ``checkout`` (None: this one)."""
    command = [sys.executable, "-m", "bench.ingest.steps", "--child", str(count)]
    done = subprocess.run(
        [*command, "--checkout", checkout] if checkout else command,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=5000, help="calls per pass")
    parser.add_argument("--previous", metavar="CHECKOUT")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--checkout", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.checkout:  # its receiver package, before bench.common puts ours on the path
            sys.path.insert(0, args.checkout)
        import receiver.intake.endpoint

        print(
            f"receiver from {Path(receiver.intake.endpoint.__file__).parents[2]}", file=sys.stderr
        )
        print(json.dumps(asyncio.run(_steps(args.child))))
        return 0
    from bench.common import Table, median

    checkouts: dict[str, str | None] = {"this": None}
    if args.previous:
        checkouts["previous"] = args.previous
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in checkouts}
    for index in range(args.rounds):
        names = list(checkouts) if index % 2 == 0 else list(checkouts)[::-1]
        for name in names:
            runs[name].append(measure(checkouts[name], args.count))
    headers = ["step"]
    for name in checkouts:
        headers += [f"{name} median µs", f"{name} min-max"]
    if args.previous:
        headers.append("this / previous")
    table = Table(headers)
    for step in STEPS:
        cells: list[str] = [step]
        medians = []
        for name in checkouts:
            values = [run[step] / 1000 for run in runs[name]]
            medians.append(median(values))
            cells += [f"{median(values):.2f}", f"{min(values):.2f}-{max(values):.2f}"]
        if args.previous:
            cells.append(f"{medians[0] / medians[1]:.2f}")
        table.add(*cells)
    load = os.getloadavg()[0]
    print(f"bench ingest steps: {args.rounds} rounds x {args.count} calls, load {load:.2f}")
    print(table.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
