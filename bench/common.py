"""What every benchmark shares: servers in subprocesses, wrk runs, signed events, reporting.

Benchmarks measure their baselines in the same run, alternating rounds, and print ratios of
medians: on a shared machine absolute figures drift with the load, the ratios much less.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from receiver.signature import webhook_headers  # noqa: E402
from tests.support.helpers import write_config  # noqa: E402

_handed_out: set[int] = set()


def free_port() -> int:
    """A free local port, never one this run handed out before (the kernel may repeat one)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


__all__ = [
    "ROOT",
    "Server",
    "Table",
    "WrkResult",
    "event_loop_name",
    "free_port",
    "median",
    "need_wrk",
    "run_wrk",
    "scratch",
    "webhook_body",
    "write_config",
    "write_requests",
]

SECRET = "whsec_benchmark_secret"
WEBHOOK_PATH = "/webhooks"
WRK_SCRIPT = ROOT / "bench" / "webhooks.lua"


def event_loop_name() -> str:
    """The loop ``receiver serve`` uses on this install: uvloop when importable."""
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"


def python_module(loop: str, module: str, *args: str) -> list[str]:
    """The command running ``python -m module args`` on ``loop`` (see bench/loop.py)."""
    return [sys.executable, "-m", "bench.loop", loop, module, *args]


def bench_env() -> dict[str, str]:
    """Environment for server subprocesses: the project importable from any directory."""
    return {"PYTHONPATH": str(ROOT)}


def need_wrk() -> str:
    path = shutil.which("wrk")
    if path is None:
        sys.exit("bench: wrk is not installed (apt-get install wrk, or run it via make)")
    return path


@contextlib.contextmanager
def scratch(prefix: str, keep: bool = False) -> Iterator[Path]:
    """A temporary directory on the same disk as the project (not a tmpfs: fsync must cost)."""
    base = ROOT / ".bench"
    base.mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------- events


def webhook_body(token: str) -> bytes:
    """A realistic ``job.completed`` body (~800 bytes, like examples/) unique to ``token``."""
    digest = hashlib.sha256(token.encode()).hexdigest()
    # UUID-shaped ids, random in order like the upstream's: index inserts land all over the
    # B-tree, as they do in production (sequential ids would flatter the store).
    event_id, job_id, mascot, image, transparent = (
        f"{d[:8]}-{d[8:12]}-4{d[13:16]}-8{d[17:20]}-{d[20:32]}"
        for d in (
            digest,
            digest[32:] + digest[:32],
            hashlib.sha256(digest.encode()).hexdigest(),
            hashlib.sha256(b"i" + digest.encode()).hexdigest(),
            hashlib.sha256(b"t" + digest.encode()).hexdigest(),
        )
    )
    expires = 1767229200
    sig = digest
    payload = {
        "id": event_id,
        "object": "event",
        "event": "job.completed",
        "job_id": job_id,
        "type": "image_generation",
        "mascot_id": mascot,
        "asset_ids": {"image": image, "transparent_image": transparent},
        "urls": {
            "image": f"https://cdn.example.invalid/assets/{mascot}/{image}.png"
            f"?expires={expires}&sig={sig}",
            "transparent_image": f"https://cdn.example.invalid/assets/{mascot}/{transparent}.png"
            f"?expires={expires}&sig={sig}",
        },
        "timestamp": "2026-01-01T00:00:12.345Z",
    }
    return json.dumps(payload, separators=(",", ":")).encode()


def signed_request(token: str, *, host: str, path: str = WEBHOOK_PATH, now: int) -> bytes:
    """The exact bytes of one signed webhook POST, as the upstream sends it."""
    body = webhook_body(token)
    event_id = json.loads(body)["id"]
    headers = webhook_headers(SECRET, body, now, event_id=event_id, event_name="job.completed")
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def write_requests(
    directory: Path, prefix: str, count: int, *, threads: int, host: str, now: int | None = None
) -> Path:
    """``count`` distinct signed requests split over ``threads`` files for the wrk script.

    Each file is the raw requests separated by NUL bytes (never part of a request here).
    Returns the path prefix the Lua script is given.
    """
    now = int(time.time()) if now is None else now
    base = directory / prefix
    handles = [open(f"{base}-{t}.bin", "wb") for t in range(threads)]  # noqa: SIM115
    try:
        for i in range(count):
            handle = handles[i % threads]
            handle.write(signed_request(f"{prefix}-{i:08d}", host=host, now=now))
            handle.write(b"\0")
    finally:
        for handle in handles:
            handle.close()
    return base


# --------------------------------------------------------------------------- wrk


@dataclass
class WrkResult:
    """One wrk run: throughput, latency percentiles, failures, and whether ids repeated."""

    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    non_2xx: int
    socket_errors: int
    reused: int
    #: The server's CPU time per request (all its threads and child processes), when measured.
    cpu_us: float = 0.0
    # The database server's CPU a request (every ``postgres`` process), for Postgres targets.
    db_cpu_us: float | None = None

    def cpu_text(self) -> str:
        """``CPU ... us/req``, with the database's share when measured (for progress lines)."""
        text = f"CPU {self.cpu_us:4.0f} us/req"
        if self.db_cpu_us is not None:
            text += f" + database {self.db_cpu_us:4.0f} us/req"
        return text

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def failures(self) -> int:
        return self.non_2xx + self.socket_errors


def run_wrk(
    url: str,
    requests_prefix: Path,
    *,
    threads: int,
    connections: int,
    seconds: float,
    timeout: float = 10.0,
) -> WrkResult:
    """Fire the pre-signed requests at ``url`` with wrk; the Lua script reports JSON."""
    command = [
        need_wrk(),
        f"-t{threads}",
        f"-c{connections}",
        f"-d{seconds:g}s",
        f"--timeout={timeout:g}s",
        "-s",
        str(WRK_SCRIPT),
        url,
        "--",
        str(requests_prefix),
        str(threads),
    ]
    out = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 120)
    if out.returncode != 0:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stderr.strip() or out.stdout}")
    for line in out.stdout.splitlines():
        if line.startswith("WRKJSON "):
            data = json.loads(line[len("WRKJSON ") :])
            return WrkResult(
                requests=data["requests"],
                seconds=data["duration_us"] / 1e6,
                p50_ms=data["p50_us"] / 1e3,
                p99_ms=data["p99_us"] / 1e3,
                max_ms=data["max_us"] / 1e3,
                non_2xx=data["status_errors"],
                socket_errors=data["connect"] + data["read"] + data["write"] + data["timeout"],
                reused=data["reused"],
            )
    raise RuntimeError(f"wrk printed no result:\n{out.stdout}\n{out.stderr}")


# --------------------------------------------------------------------------- servers


class Server:
    """A server subprocess with its output in a log file, stopped with SIGTERM then SIGKILL."""

    def __init__(
        self, name: str, command: Sequence[str], *, port: int, cwd: Path, env: dict[str, str]
    ) -> None:
        self.name = name
        self.command = list(command)
        self.port = port
        self.cwd = cwd
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        self.log_path = cwd / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_path: str = "/healthz", timeout: float = 30.0) -> Server:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command, cwd=self.cwd, env=self.env, stdout=log, stderr=log
            )
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.port}{ready_path}"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited early:\n{self.log()}")
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {timeout} s:\n{self.log()}")

    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def start_all(servers: dict[str, Server]) -> dict[str, Server]:
    """Starts each of ``servers`` in turn; when one fails, stops all of them and raises."""
    try:
        for server in servers.values():
            server.start()
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


def start_stub(loop: str, cwd: Path, *args: str) -> Server:
    """bench/stub.py, the fast upstream stand-in, started on a free port (its ``port``)."""
    port = free_port()
    return Server(
        "stub",
        python_module(loop, "bench.stub", "--port", str(port), *args),
        port=port,
        cwd=cwd,
        env=bench_env(),
    ).start()


def receiver_config(
    directory: Path,
    *,
    port: int,
    admin_port: int,
    synchronous: str = "full",
    base_url: str = "http://127.0.0.1:9/v1",
    sinks: list[dict[str, Any]] | None = None,
    worker: dict[str, Any] | None = None,
    db: str = "inbox.db",
    store: dict[str, Any] | None = None,
    processes: int = 1,
) -> Path:
    """A config for ``receiver serve`` in ``directory`` (JSON logs, the bench secret);
    ``store`` replaces the SQLite inbox (e.g. a Postgres url and schema)."""
    if sinks is None:
        sinks = [{"name": "files", "type": "download", "directory": "downloads"}]
    return write_config(
        directory / "config.toml",
        {
            "server": {
                "host": "127.0.0.1",
                "port": port,
                "path": WEBHOOK_PATH,
                # Only when asked: a receiver of an older checkout (--previous) lacks the key.
                **({"processes": processes} if processes != 1 else {}),
            },
            "admin": {"port": admin_port},
            "webhook": {"secrets": [SECRET]},
            "api": {"base_url": base_url, "api_key": "service_" + "be" * 32},
            "store": store or {"url": f"sqlite:///{db}", "synchronous": synchronous},
            "worker": worker or {},
            "log": {"format": "json", "level": "info"},
            "sinks": sinks,
        },
    )


def receiver_command(
    config: Path, role: str, loop: str | None = None, module: str = "receiver"
) -> list[str]:
    """``receiver serve`` (or another module taking its arguments) on ``loop``."""
    return python_module(
        loop or event_loop_name(), module, "serve", "--config", str(config), "--role", role
    )


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def read_toml(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text())


# --------------------------------------------------------------------------- reporting


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


@dataclass
class Table:
    """A plain text table printed at the end of a run."""

    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def render(self) -> str:
        widths = [
            max([len(self.headers[i]), *(len(r[i]) for r in self.rows)])
            for i in range(len(self.headers))
        ]
        lines = ["  ".join(h.ljust(w) for h, w in zip(self.headers, widths, strict=True))]
        lines.append("  ".join("-" * w for w in widths))
        lines += [
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in self.rows
        ]
        return "\n".join(lines)


def machine_note(loop: str | None = None) -> str:
    """CPU count and load, printed with every result: the context the figures were taken in."""
    load = os.getloadavg()
    return (
        f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"python {sys.version.split()[0]}, loop {loop or event_loop_name()}"
    )
