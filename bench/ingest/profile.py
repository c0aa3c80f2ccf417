"""Where intake's time goes: py-spy on a receiver under wrk load, summed under ``Intake._handle``.

Starts one target of :mod:`bench.ingest` (``no-store`` by default: the receiver storing nothing),
loads it with wrk as the benchmark does, and samples its event loop thread with ``py-spy record``
in its default blocking mode (each sample stops the process, so the rate under the profiler is
lower than the benchmark's; the shares are what it is for). Prints the share of the loop
thread's samples spent in ``Intake._handle`` and below, and the functions below it by inclusive
and by own samples::

    python -m bench.ingest.profile [--target no-store] [--seconds 10] [--raw out.txt]

Needs py-spy (``pip install py-spy``) and the right to trace the server (root, or
``kernel.yama.ptrace_scope = 0``).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import event_loop_name, machine_note, need_wrk, run_wrk, scratch, write_requests
from bench.ingest.__main__ import drop_schemas, start_servers

HANDLER = "Intake._handle"
LOOP_THREAD = "Runner.run"  # every sample of the loop thread passes through asyncio's runner
_FRAME = re.compile(r"^(?P<function>.+) \((?P<file>[^:()]+)(?::\d+)?\)$")


def function_of(frame: str) -> str:
    """``function (module path)`` without the line number, so a function's lines add up."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    path = match["file"]
    for marker in ("site-packages/", "python3.11/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{match['function']} ({path})"


def summarize(raw: Path, top: int) -> list[str]:
    """The report on py-spy's raw (collapsed stacks) output."""
    loop_samples = handler = 0
    everywhere: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    children: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        if not any(LOOP_THREAD in f for f in frames):
            continue
        loop_samples += count
        names = [function_of(f) for f in frames]
        everywhere[names[-1]] += count
        index = next((i for i, n in enumerate(names) if n.startswith(HANDLER + " ")), None)
        if index is None:
            continue
        handler += count
        below = names[index + 1 :]
        for name in set(below):
            inclusive[name] += count
        if below:
            children[below[0]] += count
            own[below[-1]] += count
        else:
            own[names[index]] += count
    if not loop_samples:
        return ["no sample of the event loop thread (was the server under load?)"]

    def share(n: int) -> str:
        return f"{100 * n / loop_samples:5.1f}%"

    lines = [
        f"loop thread: {loop_samples} samples; {HANDLER} and below: {share(handler)}",
        "",
        f"called from {HANDLER} directly (inclusive, % of the loop thread):",
    ]
    lines += [f"  {share(n)}  {name}" for name, n in children.most_common(top)]
    lines += ["", f"anywhere below {HANDLER} (inclusive):"]
    lines += [f"  {share(n)}  {name}" for name, n in inclusive.most_common(top)]
    lines += ["", f"own time below {HANDLER} (the frame sampled):"]
    lines += [f"  {share(n)}  {name}" for name, n in own.most_common(top)]
    lines += ["", "own time anywhere on the loop thread (aiohttp's machinery included):"]
    lines += [f"  {share(n)}  {name}" for name, n in everywhere.most_common(top)]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--target", default="no-store", choices=("no-store", "sqlite", "postgres", "bare")
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples a second")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--synchronous", choices=("full", "normal"), default="full")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default=event_loop_name())
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--raw", type=Path, help="also keep py-spy's raw output here")
    args = parser.parse_args(argv)
    args.previous = None
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        sys.exit("bench: py-spy is not installed (pip install py-spy)")
    need_wrk()
    print(f"bench ingest profile ({args.target}): {machine_note(args.loop)}")
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    pool = Path(tempfile.mkdtemp(prefix="receiver-bench-", dir=shm))
    schemas: dict[str, str] = {}
    try:
        with scratch("profile-") as work:
            server = start_servers(work, args, (args.target,), schemas)[args.target]
            try:
                url = f"http://127.0.0.1:{server.port}/webhooks"
                host = f"127.0.0.1:{server.port}"
                warm = write_requests(pool, "warm", 30000, threads=args.threads, host=host)
                run_wrk(url, warm, threads=args.threads, connections=64, seconds=2)
                count = int(30000 * args.seconds)
                load = write_requests(pool, "load", count, threads=args.threads, host=host)
                raw = args.raw or pool / "profile.txt"
                record = [spy, "record", "-p", str(server.pid()), "-r", str(args.rate)]
                record += ["-d", f"{args.seconds + 1:.0f}", "--format", "raw", "-o", str(raw)]
                sampler = subprocess.Popen(record, stdout=subprocess.DEVNULL)
                time.sleep(0.5)
                result = run_wrk(
                    url, load, threads=args.threads, connections=64, seconds=args.seconds
                )
                sampler.wait()
            finally:
                server.stop()
                if schemas:
                    drop_schemas(schemas)
        print(
            f"  under the profiler: {result.rps:,.0f} req/s, p99 {result.p99_ms:.1f} ms, "
            f"non-2xx {result.failures}\n"
        )
        print("\n".join(summarize(raw, args.top)))
    finally:
        shutil.rmtree(pool, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
