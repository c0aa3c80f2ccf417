"""bench-scale part 3's prune counter: read once a second from the prune side's worker."""

from __future__ import annotations

import threading
import time

from bench.scale.prune_sides import Side, pruned_events

POLL_SECONDS = 1.0
#: (monotonic time, events pruned so far; None without the counter)
Reading = tuple[float, int | None]


class PruneWatch(threading.Thread):
    """Reads every running worker's prune counter once a second (all alike: the reads cost each
    side the same) and keeps the prune side's, the last of ``sides``; a stopped side is not
    read (it would not answer), so every reading of the prune side's is taken while it runs."""

    def __init__(self, sides: list[Side], stored: int) -> None:
        super().__init__(daemon=True)
        self.sides = sides
        self.stored = stored
        self.samples: list[Reading] = []
        self.finished_at: float | None = None
        self._halt = threading.Event()
        self._sampling = threading.Lock()  # the thread's readings and the run's, in order
        self.sample()

    def sample(self) -> Reading:
        """A reading now (the latest one when the prune side is stopped)."""
        with self._sampling:
            for side in self.sides:
                with side.lock:
                    if not side.running:
                        continue
                    value = pruned_events(side.admin_port)
                    now = time.monotonic()
                if side is self.sides[-1]:
                    self.samples.append((now, value))
                    if value is not None and value >= self.stored and self.finished_at is None:
                        self.finished_at = now
            return self.samples[-1]

    def run(self) -> None:
        while not self._halt.wait(POLL_SECONDS):
            self.sample()

    def latest(self) -> Reading:
        return self.samples[-1]

    def since(self, started: float) -> Reading:
        """The first reading taken at ``started`` or later (the latest when none)."""
        return next((s for s in list(self.samples) if s[0] >= started), self.samples[-1])

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def rate(before: Reading, after: Reading) -> float | None:
    if before[1] is None or after[1] is None or after[0] <= before[0]:
        return None
    return (after[1] - before[1]) / (after[0] - before[0])


def rate_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f} events/s"
