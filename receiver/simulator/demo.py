"""``make demo``: the simulator and a receiver, a mix of events with faults, then a report.

Run from the project's root (``python -m receiver.simulator.demo``). It uses only the public
commands, as a user would:

1. ``receiver simulate`` on 127.0.0.1:18090, asked for a mix of jobs with faults on;
2. ``receiver webhooks register`` subscribes the receiver's URL: the upstream's secret lands in
   ``data/demo/webhook-secrets`` (0600), and the simulator starts sending;
3. ``receiver serve`` with ``examples/demo.toml`` (public :18080, ops :18091), which reads that
   secret at start. The simulator's first attempts find nobody listening yet and are retried on
   the upstream's schedule, compressed by ``--time-scale``;
4. waits until every event is delivered and processed, asks ``receiver upstream check`` whether
   the simulator's API differs from the one the receiver was built for, prints what happened,
   stops both.

Everything is written under ``data/demo`` (wiped at the start), logs included. A fixed port
that is taken is replaced by a free one, in a copy of the config at ``data/demo/demo.toml``.
The caller's ``RECEIVER_*`` variables are not passed on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

CONFIG = Path("examples/demo.toml")
DATA = Path("data/demo")
SIM_PORT, PUBLIC_PORT, OPS_PORT = 18090, 18080, 18091
API_KEY = "service_" + "de30" * 16
ADMIN_TOKEN = "demo-admin-token"  # noqa: S105 - the demo config's, not a secret
EVENTS = 15
KINDS = "image,animation,logo,scene,failed"
FAULTS: dict[str, str | None] = {
    "--duplicates": "0.2",  # a fifth of the events delivered twice
    "--out-of-order": "0.2",  # held back up to 1.5 s, so later events overtake them
    "--hold-back": "1.5",
    "--clock-skew": "20",  # the signer's clock 20 s ahead (within the 300 s tolerance)
    "--derived-delay": "2",  # webm/hevc/stacked_video finish 2 s after their job
    "--derived-missing": None,  # and until then do not exist (their GET /v1/assets answers 404)
    "--rate-limit": "0.05",  # one API call in twenty answers 429 with Retry-After: 1
    "--retry-after": "1",
    "--server-errors": "0.03",  # a few answer 500
    "--expired-urls": "0.05",  # and a few signed file URLs are issued already expired
}
TIME_SCALE = "0.001"  # retries after 60 ms, 300 ms, 1.8 s, 7.2 s ... instead of 1 min, 5 min ...
DEADLINE_SECONDS = 50.0


class DemoError(Exception):
    """The demo could not run; the message says why."""


class Demo:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        # The demo's settings only: none from the caller's RECEIVER_* variables.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:5.1f}s] {text}", flush=True)

    # ----------------------------------------------------------------- processes

    def start(self, name: str, args: list[str], *, stdout: Path, log: Path) -> None:
        with stdout.open("ab") as out, log.open("ab") as err:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "receiver", *args], stdout=out, stderr=err, env=self.env
            )
        self.logs[name] = log

    def stop(self, name: str, timeout: float = 15.0) -> int:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            tail = self.logs[name].read_text(errors="replace").strip().splitlines()[-3:]
            raise DemoError(f"{name} exited with {proc.returncode}: " + " | ".join(tail))

    # ----------------------------------------------------------------- the run

    def run(self) -> int:
        shutil.rmtree(DATA, ignore_errors=True)
        DATA.mkdir(parents=True)
        # The fixed ports when free, else any free ones, written into a copy of the config.
        config_text = CONFIG.read_text()
        sim_port, public_port, ops_port = ports = [
            self.port(p) for p in (SIM_PORT, PUBLIC_PORT, OPS_PORT)
        ]
        for default, chosen in zip((SIM_PORT, PUBLIC_PORT, OPS_PORT), ports, strict=True):
            config_text = config_text.replace(str(default), str(chosen))
        config = DATA / "demo.toml"
        config.write_text(config_text)
        sim_url = f"http://127.0.0.1:{sim_port}"

        faults = [item for pair in FAULTS.items() for item in pair if item is not None]
        self.start(
            "simulator",
            [
                *("simulate", "--port", str(sim_port), "--api-key", API_KEY),
                *("--events", str(EVENTS), "--kinds", KINDS, "--rate", "10"),
                *("--time-scale", TIME_SCALE, *faults, "--log-level", "warning"),
                *("--seed", "0"),  # the same faults on every run: the report stays comparable
                *("--summary-json", str(DATA / "simulator-summary.json")),
            ],
            stdout=DATA / "simulator-summary.txt",
            log=DATA / "simulator.log",
        )
        self.wait(lambda: _get_json(f"{sim_url}/_simulator/summary") is not None, "simulator")
        self.say(f"simulator  {sim_url}/v1: {EVENTS} jobs ({KINDS}) once a subscription exists")
        self.say("           faults: " + " ".join(faults))
        self.say(
            f"           retries on the upstream's schedule x {TIME_SCALE} "
            "(1 min -> 60 ms, 5 min -> 300 ms, 30 min -> 1.8 s ...)"
        )

        public_url = f"http://127.0.0.1:{public_port}/webhooks"
        register = subprocess.run(
            [
                *(sys.executable, "-m", "receiver", "webhooks", "register"),
                *("--config", str(config), "--url", public_url),
            ],
            capture_output=True,
            text=True,
            check=False,
            env=self.env,
        )
        if register.returncode != 0:
            raise DemoError(f"webhooks register failed: {register.stderr.strip()}")
        self.say(f"$ receiver webhooks register --config {config} --url {public_url}")
        for line in register.stdout.strip().splitlines():
            print(f"           {line}")

        self.start(
            "receiver",
            ["serve", "--config", str(config)],
            stdout=DATA / "receiver.log",
            log=DATA / "receiver.log",
        )
        ops = f"http://127.0.0.1:{ops_port}"
        self.wait(lambda: _get_json(f"{ops}/readyz") is not None, "receiver")
        self.say(f"receiver   {public_url}, ops {ops} (ready)")
        self.say("           (sending began at the registration: attempts made before the")
        self.say("           receiver listened failed and are retried on that schedule)")

        def finished() -> bool:
            summary = _get_json(f"{sim_url}/_simulator/summary")
            events = _admin_events(ops)
            if summary is None or events is None or not summary["settled"]:
                return False
            delivered = summary["delivery"]["events_delivered"]
            return len(events) == delivered and all(e["state"] != "pending" for e in events)

        self.wait(finished, "every event delivered and processed")
        summary = _get_json(f"{sim_url}/_simulator/summary") or {}
        events = _admin_events(ops) or []
        metrics = _metrics(ops)
        states = [e["state"] for e in events]
        self.say(
            f"all {summary['delivery']['events_delivered']} events delivered; the receiver has "
            f"finished them: {states.count('done')} done, {states.count('dead')} dead"
        )
        verdict = self.upstream_check(config)
        receiver_code = self.stop("receiver")
        simulator_code = self.stop("simulator")
        self.say(
            f"stopped the receiver (exit {receiver_code}) and the simulator (exit {simulator_code})"
        )
        print()
        self.report(events, metrics)
        print()
        print((DATA / "simulator-summary.txt").read_text().rstrip())
        print()
        print("\n".join(verdict))
        print()
        print(f"logs: {DATA}/receiver.log (JSON lines), {DATA}/simulator.log")
        ok = (
            receiver_code == 0 and simulator_code == 0 and all(e["state"] == "done" for e in events)
        )
        return 0 if ok else 1

    def upstream_check(self, config: Path) -> list[str]:
        """``receiver upstream check`` against the simulator: the command and what it printed.
        The simulator's faults answer its document too (a 429, a 500): asked up to three times."""
        args = ["upstream", "check", "--config", str(config)]
        for _ in range(3):
            check = subprocess.run(
                [sys.executable, "-m", "receiver", *args],
                capture_output=True,
                text=True,
                check=False,
                env=self.env,
            )
            if check.returncode != 2:
                break
        printed = (check.stdout + check.stderr).strip().splitlines()
        return [f"$ receiver {' '.join(args)}", *printed, f"(exit {check.returncode})"]

    def port(self, preferred: int) -> int:
        if _free(preferred):
            return preferred
        chosen = _any_free_port()
        self.say(f"port {preferred} is in use; using {chosen} instead")
        return chosen

    def wait(self, check: Any, what: str) -> None:
        deadline = self.started + DEADLINE_SECONDS
        while time.monotonic() < deadline:
            for name in list(self.procs):
                self.alive(name)
            if check():
                return
            time.sleep(0.2)
        raise DemoError(f"gave up waiting for {what} after {DEADLINE_SECONDS:.0f} s")

    def report(self, events: list[dict[str, Any]], metrics: dict[str, list[Any]]) -> None:
        print("receiver")
        by_state: dict[str, int] = {}
        for event in events:
            key = f"{event['event']} {event['state']}"
            by_state[key] = by_state.get(key, 0) + 1
        print(
            "  events in the inbox  " + ", ".join(f"{v} {k}" for k, v in sorted(by_state.items()))
        )
        print(
            "  webhook requests     "
            + _labelled(metrics, "receiver_webhook_requests_total", "outcome")
        )
        for sink in ("files", "animations"):
            print(
                f"  sink {sink:<15} "
                + _labelled(metrics, "receiver_sink_deliveries_total", "outcome", sink=sink)
            )
        for endpoint in ("/jobs/{id}", "/assets/{id}", "/webhooks"):
            print(
                f"  upstream {endpoint:<11} "
                + _labelled(
                    metrics, "receiver_upstream_requests_total", "status", endpoint=endpoint
                )
            )
        lag = _histogram(metrics, "receiver_event_lag_seconds")
        skew = _buckets(metrics, "receiver_signature_skew_seconds")
        print(f"  event lag            {lag} (receipt to last sink done)")
        print(f"  signature skew       {skew} (receiver clock minus signature t)")
        for sample in metrics.get("receiver_upstream_webhook_active", []):
            webhook_id = sample.labels["webhook_id"]
            failures = next(
                (
                    s.value
                    for s in metrics.get("receiver_upstream_webhook_consecutive_failures", [])
                    if s.labels["webhook_id"] == webhook_id
                ),
                0,
            )
            print(
                f"  watchdog             {webhook_id} active={int(sample.value)} "
                f"consecutive_failures={int(failures)}"
            )
        for sink_dir in ("downloads", "animations"):
            root = DATA / sink_dir
            files = sorted(p for p in root.rglob("*") if p.is_file())
            size = sum(p.stat().st_size for p in files)
            print(f"  files in {root}/  {len(files)} ({size / 1024:.1f} KiB)")
            for path in files:
                print(f"    {path.relative_to(root)}")


def _free(port: int) -> bool:
    """Whether a server could listen on ``port`` now: as servers do, ``SO_REUSEADDR``, so the
    connections of a run that just ended (TIME_WAIT) do not count."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _any_free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, *, token: str | None = None) -> bytes | None:
    request = urllib.request.Request(url)  # noqa: S310 - fixed http://127.0.0.1 URLs
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=2) as response:  # noqa: S310
            body: bytes = response.read()
            return body
    except (urllib.error.URLError, OSError):
        return None


def _get_json(url: str, *, token: str | None = None) -> Any:
    body = _get(url, token=token)
    return None if body is None else json.loads(body)


def _admin_events(ops: str) -> list[dict[str, Any]] | None:
    answer = _get_json(f"{ops}/admin/events?limit=1000", token=ADMIN_TOKEN)
    return None if answer is None else list(answer["data"])


def _metrics(ops: str) -> dict[str, list[Any]]:
    text = (_get(f"{ops}/metrics") or b"").decode()
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def _labelled(metrics: dict[str, list[Any]], name: str, label: str, **where: str) -> str:
    counts = [
        (s.labels[label], int(s.value))
        for s in metrics.get(name, [])
        if s.value and all(s.labels.get(k) == v for k, v in where.items())
    ]
    return ", ".join(f"{key} {value}" for key, value in sorted(counts)) or "none"


def _histogram(metrics: dict[str, list[Any]], name: str) -> str:
    count = next((s.value for s in metrics.get(f"{name}_count", [])), 0)
    total = next((s.value for s in metrics.get(f"{name}_sum", [])), 0)
    if not count:
        return "no observations"
    return f"mean {total / count:.2f} s over {int(count)}"


def _buckets(metrics: dict[str, list[Any]], name: str) -> str:
    """Where a histogram's observations fall (its _sum is not exported with negative buckets)."""
    buckets = sorted((float(s.labels["le"]), s.value) for s in metrics.get(f"{name}_bucket", []))
    total = buckets[-1][1] if buckets else 0
    if not total:
        return "no observations"
    lower = max((le for le, count in buckets if count == 0), default=float("-inf"))
    upper = min(le for le, count in buckets if count == total)
    return f"all {int(total)} in ({lower:g} s, {upper:g} s]"


def main() -> int:
    if not CONFIG.is_file():
        print(
            f"receiver demo: run it from the project's root ({CONFIG} not found)", file=sys.stderr
        )
        return 2
    demo = Demo()
    try:
        return demo.run()
    except DemoError as exc:
        print(f"receiver demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        demo.stop_all()


if __name__ == "__main__":
    sys.exit(main())
