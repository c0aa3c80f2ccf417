"""Counters and a histogram counted in plain numbers by the event loop, read at scrape time.

prometheus_client's ``Counter.inc`` and ``Histogram.observe`` take a lock each (two for an
observation), several times for every webhook. The families intake counts are instead kept here
as plain integers, only ever changed by the event loop's thread (intake, the poller, reconcile
and the lanes all run there), and exposed through a custom collector (prometheus-client's
documented way: an object with ``collect()`` yielding metric families, registered on the
registry). The scrape runs on the same thread, so it reads a consistent state without a lock.

What ``/metrics`` shows is the same as prometheus_client's own ``Counter`` and ``Histogram``
would show: the same family names, types, help, labels, label order, values and ``_created``
samples (unless ``PROMETHEUS_DISABLE_CREATED_SERIES`` turns those off for every family).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import metrics as _client_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import INF, floatToGoString


def _created_series() -> bool:
    # The switch prometheus_client's own families follow (disable_created_metrics() flips it).
    return bool(getattr(_client_metrics, "_use_created", True))


class Count:
    """One counter series: ``value`` is a plain number the loop adds to."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0
        self.created = time.time()

    def inc(self, amount: int = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount

    def get(self) -> float:
        return float(self.value)


class LoopCounter:
    """A counter family whose series are :class:`Count` objects (see the module)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], Count] = {}
        registry.register(self)

    def labels(self, *values: object) -> Count:
        """The series of these label values, created (at 0) the first time."""
        key = tuple(str(v) for v in values)
        series = self._series.get(key)
        if series is None:
            if len(key) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {key}")
            series = self._series[key] = Count()
        return series

    def describe(self) -> list[Metric]:
        return [Metric(self.name, self.documentation, "counter")]

    def collect(self) -> Iterator[Metric]:
        family = Metric(self.name, self.documentation, "counter")
        created = _created_series()
        for key, series in list(self._series.items()):
            labels = dict(zip(self.labelnames, key, strict=True))
            family.add_sample(self.name + "_total", labels, float(series.value))
            if created:
                family.add_sample(self.name + "_created", labels, series.created)
        yield family


class LoopHistogram:
    """A histogram without labels, its buckets counted in plain integers (see the module).

    ``observe`` finds the bucket by bisection: an observation lands in the first bucket whose
    upper bound is at least the amount, as in prometheus_client.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("Buckets not in sorted order")
        if not bounds or bounds[-1] != INF:
            bounds.append(INF)
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(bounds)
        self._le = tuple(str(floatToGoString(b)) for b in bounds)  # type: ignore[no-untyped-call]
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()
        registry.register(self)

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount

    def describe(self) -> list[Metric]:
        return [Metric(self.name, self.documentation, "histogram")]

    def collect(self) -> Iterator[Metric]:
        family = Metric(self.name, self.documentation, "histogram")
        total = 0
        for le, count in zip(self._le, self.counts, strict=True):
            total += count
            family.add_sample(self.name + "_bucket", {"le": le}, float(total))
        family.add_sample(self.name + "_count", {}, float(total))
        if self.bounds[0] >= 0:  # as prometheus_client: no _sum when a bucket is negative
            family.add_sample(self.name + "_sum", {}, self.sum)
        if _created_series():
            family.add_sample(self.name + "_created", {}, self.created)
        yield family
