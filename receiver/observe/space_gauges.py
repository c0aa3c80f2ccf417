"""The inbox's space gauges, and the one log line that says its indexes outgrew the cache.

A webhook inserts into indexes keyed by random ids (the event id, the job id, the delivery, the
job outcome). While those indexes fit in the Postgres server's ``shared_buffers`` the pages a
webhook touches are in memory; once they outgrow it, every insert reads and dirties pages the
server has to fetch and write back, and intake slows as the inbox grows (docs/postgres.md,
"Memory for a large inbox"). Retention bounds the inbox, so the answer is a larger cache or a
shorter ``store.retention_hours``: the receiver says so once when it happens, and
``ReceiverInboxOutgrowsDatabaseCache`` (deploy/prometheus/alerts.yml) says it to Prometheus.
"""

from __future__ import annotations

from receiver.logs import get_logger
from receiver.observe.metrics import Metrics
from receiver.store.space import InboxSpace

log = get_logger("receiver.store.postgres")

_MIB = 1024 * 1024


class InboxSpaceGauges:
    """``update(space)`` after each measure of the inbox's space."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._outgrown = False

    def update(self, space: InboxSpace) -> None:
        metrics = self._metrics
        metrics.inbox_file_bytes.set(space.file_bytes)
        if space.free_bytes is not None:
            metrics.inbox_free_bytes.set(space.free_bytes)
        if space.index_bytes is None or space.cache_bytes is None:
            return
        metrics.inbox_index_bytes.set(space.index_bytes)
        metrics.inbox_cache_bytes.set(space.cache_bytes)
        outgrown = space.index_bytes > space.cache_bytes
        if outgrown and not self._outgrown:
            log.warning(
                "the inbox's indexes outgrew the database server's shared_buffers: intake slows "
                "as the inbox grows; give the server more shared_buffers (docs/postgres.md)",
                index_mib=round(space.index_bytes / _MIB, 1),
                shared_buffers_mib=round(space.cache_bytes / _MIB, 1),
            )
        self._outgrown = outgrown
