"""How long the inbox keeps events and the ledgers remember them (``[store].retention_hours``,
``[store].ledger_retention_days``), and how often the retention loop (:mod:`receiver.ops.retention`)
runs; read by that loop and by reconcile, which skips assets the ledgers no longer remember.

For benchmarks and tests only, ``RECEIVER_BENCH_RETENTION_SECONDS=<s>`` replaces the configured
retention by ``s`` seconds (below the production minimum; the ledgers' in proportion) and runs a
cycle every tenth of it, so that an hour of traffic shows weeks of arrivals and expiries. Never
set it in production: an event id forgotten before the upstream stops retrying it would be
accepted twice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from receiver.config.settings import StoreSettings
from receiver.logs import get_logger

log = get_logger("receiver.retention")

BENCH_ENV = "RECEIVER_BENCH_RETENTION_SECONDS"
CYCLE_SECONDS = 3600.0


@dataclass(frozen=True)
class Timing:
    """How long events are kept, how long the ledgers remember, and how often a cycle runs."""

    retention_seconds: float
    cycle_seconds: float
    ledger_seconds: float | None = None  # None: the ledgers are not pruned

    @classmethod
    def of(cls, store: StoreSettings) -> Timing:
        retention = store.retention_hours * 3600
        # Never shorter than the events' own: an outcome whose event is still kept stays known.
        ledger = max(store.ledger_retention_days * 86400, retention)
        bench = os.environ.get(BENCH_ENV, "").strip()
        if bench:
            seconds = float(bench)
            log.warning(
                "retention shortened for a benchmark or a test; never in production",
                variable=BENCH_ENV,
                retention_seconds=seconds,
            )
            # The ledgers' retention shrinks in the same proportion.
            return cls(seconds, max(seconds / 10, 1.0), ledger * seconds / retention)
        return cls(retention, CYCLE_SECONDS, ledger)
