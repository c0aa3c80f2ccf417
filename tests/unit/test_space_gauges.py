"""The inbox's space gauges, and the warning once a Postgres inbox's indexes outgrow the cache."""

from __future__ import annotations

from structlog.testing import capture_logs

from receiver.observe.metrics import Metrics
from receiver.observe.space_gauges import InboxSpaceGauges
from receiver.store.space import InboxSpace

MIB = 1024 * 1024


def gauge(metrics: Metrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)


def warnings(logs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [e for e in logs if e["log_level"] == "warning"]


def test_a_sqlite_inbox_sets_its_file_and_free_bytes_only() -> None:
    metrics = Metrics()
    with capture_logs() as logs:
        InboxSpaceGauges(metrics).update(InboxSpace(file_bytes=40 * MIB, free_bytes=8 * MIB))
    assert gauge(metrics, "receiver_inbox_file_bytes") == 40 * MIB
    assert gauge(metrics, "receiver_inbox_free_bytes") == 8 * MIB
    assert gauge(metrics, "receiver_inbox_index_bytes") == 0  # not reported: never set
    assert logs == []


def test_indexes_outgrowing_shared_buffers_are_said_once_each_time_they_do() -> None:
    metrics = Metrics()
    gauges = InboxSpaceGauges(metrics)

    def measured(index_mib: int) -> list[dict[str, object]]:
        space = InboxSpace(file_bytes=900 * MIB, index_bytes=index_mib * MIB, cache_bytes=128 * MIB)
        with capture_logs() as logs:
            gauges.update(space)
        return warnings(logs)

    assert measured(100) == []
    assert gauge(metrics, "receiver_inbox_index_bytes") == 100 * MIB
    assert gauge(metrics, "receiver_inbox_cache_bytes") == 128 * MIB
    (first,) = measured(230)
    assert "shared_buffers" in str(first["event"]) and "docs/postgres.md" in str(first["event"])
    assert first["index_mib"] == 230.0 and first["shared_buffers_mib"] == 128.0
    assert measured(240) == []  # still outgrown: said already
    assert measured(120) == []  # back within (retention pruned, or a larger cache)
    assert len(measured(250)) == 1  # outgrown again: said again
    assert gauge(metrics, "receiver_inbox_index_bytes") == 250 * MIB
