"""Every Prometheus metric the receiver exports, defined in one place.

Each :class:`Metrics` owns its registry, so several receivers (tests) can live in one process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_LATEST
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from receiver import __version__
from receiver.observe.loop_metrics import LoopCounter, LoopHistogram
from receiver.store.schema_version import SCHEMA_VERSION

CONTENT_TYPE = CONTENT_TYPE_LATEST
OPENMETRICS_TYPE = OPENMETRICS_LATEST

WEBHOOK_OUTCOMES = (
    "accepted",
    "duplicate",
    "missing_signature",
    "invalid_signature",
    "stale_timestamp",
    "malformed",
    "too_large",
    "unavailable",
)
SINK_OUTCOMES = ("success", "retry", "dead", "skipped")
PULL_SOURCES = ("webhook", "poll", "reconcile")
WATCH_STATES = ("watching", "done", "expired", "not_found")
DRIFT_SEVERITIES = ("breaking", "notice")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_LAG_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 6 * 3600, 24 * 3600)
_SKEW_BUCKETS = (-300, -120, -60, -30, -10, -5, -1, 0, 1, 5, 10, 30, 60, 120, 300)


class Metrics:
    """The receiver's metric families."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # receiver_build_info{version,schema} 1: which release runs, and the inbox schema it writes.
        self.build_info = Info(
            "receiver_build",
            "The receiver's release and the inbox schema version it writes (always 1).",
            registry=r,
        )
        self.build_info.info({"version": __version__, "schema": str(SCHEMA_VERSION)})
        # The families intake counts for every webhook: plain numbers in the event loop, read by
        # a custom collector at scrape time (receiver.observe.loop_metrics).
        self.webhook_requests = LoopCounter(
            "receiver_webhook_requests",
            "Webhook requests on the public listener, by outcome.",
            ["outcome"],
            registry=r,
        )
        for outcome in WEBHOOK_OUTCOMES:
            self.webhook_requests.labels(outcome)
        self.signature_skew = LoopHistogram(
            "receiver_signature_skew_seconds",
            "Receiver clock minus the signature timestamp, for accepted webhooks.",
            buckets=_SKEW_BUCKETS,
            registry=r,
        )
        self.secret_matches = LoopCounter(
            "receiver_webhook_secret_matches",
            "Verified webhooks by the position of the secret that matched (0 = first).",
            ["secret_index"],
            registry=r,
        )
        self.events = LoopCounter(
            "receiver_events",
            "Events by name and outcome (received, duplicate, processed, dead).",
            ["event", "outcome"],
            registry=r,
        )
        self.sink_deliveries = Counter(
            "receiver_sink_deliveries",
            "Sink delivery attempts by outcome (success, retry, dead, skipped).",
            ["sink", "outcome"],
            registry=r,
        )
        self.sink_delivery_seconds = Histogram(
            "receiver_sink_delivery_seconds",
            "Duration of one sink delivery attempt.",
            ["sink"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_requests = Counter(
            "receiver_upstream_requests",
            "Requests to the upstream API by endpoint and HTTP status (or timeout, error).",
            ["endpoint", "status"],
            registry=r,
        )
        self.upstream_request_seconds = Histogram(
            "receiver_upstream_request_seconds",
            "Duration of upstream API requests.",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inbox_events = Gauge(
            "receiver_inbox_events",
            "Events in the inbox by state.",
            ["state"],
            registry=r,
        )
        self.inbox_pruned = Counter(
            "receiver_inbox_pruned_events",
            "Processed events deleted after their retention.",
            registry=r,
        )
        self.ledger_pruned = Counter(
            "receiver_ledger_pruned_rows",
            "Job-outcome and asset ledger rows forgotten after store.ledger_retention_days.",
            registry=r,
        )
        self.inbox_vacuumed_bytes = Counter(
            "receiver_inbox_vacuumed_bytes",
            "Free space in the SQLite inbox given back to the file system (incremental vacuum).",
            registry=r,
        )
        self.inbox_file_bytes = Gauge(
            "receiver_inbox_file_bytes",
            "What the inbox takes on disk (SQLite: the file and its WAL; Postgres: its tables "
            "with their indexes).",
            registry=r,
        )
        self.inbox_free_bytes = Gauge(
            "receiver_inbox_free_bytes",
            "Free pages inside the SQLite inbox file (new rows reuse them).",
            registry=r,
        )
        self.inbox_index_bytes = Gauge(
            "receiver_inbox_index_bytes",
            "The Postgres inbox's indexes (part of receiver_inbox_file_bytes).",
            registry=r,
        )
        self.inbox_cache_bytes = Gauge(
            "receiver_inbox_cache_bytes",
            "The Postgres server's shared_buffers, which the inbox's indexes should fit in.",
            registry=r,
        )
        self.inbox_oldest_pending_seconds = Gauge(
            "receiver_inbox_oldest_pending_seconds",
            "Age of the oldest event still pending (0 when none).",
            registry=r,
        )
        self.sink_backlog = Gauge(
            "receiver_sink_backlog",
            "Deliveries due and waiting in each sink's lane (their job fetched, none in flight).",
            ["sink"],
            registry=r,
        )
        self.sink_oldest_due_seconds = Gauge(
            "receiver_sink_oldest_due_seconds",
            "How long the oldest due delivery of each lane has waited (0 when none).",
            ["sink"],
            registry=r,
        )
        self.sink_in_flight = Gauge(
            "receiver_sink_in_flight",
            "Deliveries being sent by this process, per sink.",
            ["sink"],
            registry=r,
        )
        self.event_lag = Histogram(
            "receiver_event_lag_seconds",
            "Time from receipt to the last sink delivery done.",
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.downloaded_bytes = Counter(
            "receiver_downloaded_bytes",
            "Bytes written by download sinks.",
            ["sink"],
            registry=r,
        )
        self.upstream_webhook_active = Gauge(
            "receiver_upstream_webhook_active",
            "1 while the upstream reports the webhook subscription active, else 0.",
            ["webhook_id"],
            registry=r,
        )
        self.upstream_webhook_failures = Gauge(
            "receiver_upstream_webhook_consecutive_failures",
            "consecutive_failures the upstream reports for the webhook subscription.",
            ["webhook_id"],
            registry=r,
        )
        # The upstream's API versions: the pinned version refused, endpoints being retired.
        self.upstream_version_refused = Gauge(
            "receiver_upstream_version_refused",
            "1 while the upstream refuses the pinned api.version (Service-API-Version), else 0.",
            registry=r,
        )
        self.upstream_deprecated = Counter(
            "receiver_upstream_deprecated",
            "Upstream answers carrying a Deprecation or Sunset header, by endpoint.",
            ["endpoint"],
            registry=r,
        )
        self.upstream_sunset = Gauge(
            "receiver_upstream_sunset_timestamp_seconds",
            "When the upstream says the endpoint goes away (its Sunset header), unix seconds.",
            ["endpoint"],
            registry=r,
        )
        self.upstream_invalid = Counter(
            "receiver_upstream_invalid",
            "Fetched upstream objects breaking the spec on a field the receiver reads.",
            ["object", "field"],
            registry=r,
        )
        # The upstream's OpenAPI document against the revision this release was built for.
        self.upstream_spec_info = Gauge(
            "receiver_upstream_spec_info",
            "The revision of the upstream's OpenAPI document last read, and api.version (1).",
            ["revision", "api_version"],
            registry=r,
        )
        self.upstream_drift = Gauge(
            "receiver_upstream_drift",
            "Differences that matter between the upstream's OpenAPI document and the baseline.",
            ["severity"],
            registry=r,
        )
        for severity in DRIFT_SEVERITIES:
            self.upstream_drift.labels(severity)

        self.background_task_restarts = Counter(
            "receiver_background_task_restarts",
            "Restarts of a background task after an unexpected exception (see the log).",
            ["task"],
            registry=r,
        )
        self.watched_jobs = Gauge(
            "receiver_watched_jobs",
            "Jobs on the watch list (pull mode) by state.",
            ["state"],
            registry=r,
        )
        self.pull_events = LoopCounter(
            "receiver_pull_events",
            "Events stored by the way they arrived: webhook, poll (a watched job) or reconcile.",
            ["source"],
            registry=r,
        )
        # Operating through an incident: lanes paused by an operator, redelivery batches.
        self.sink_paused = Gauge(
            "receiver_sink_paused",
            "1 while an operator has paused the sink's lane (receiver lanes pause), else 0.",
            ["sink"],
            registry=r,
        )
        self.sink_paused_seconds = Gauge(
            "receiver_sink_paused_seconds",
            "How long the sink's lane has been paused by an operator (0 when it is not).",
            ["sink"],
            registry=r,
        )
        self.redelivery_queued = Counter(
            "receiver_redelivery_queued",
            "Deliveries made pending again by redelivery batches this process stepped.",
            registry=r,
        )
        for state in WATCH_STATES:
            self.watched_jobs.labels(state)
        for source in PULL_SOURCES:
            self.pull_events.labels(source)

    def render(self, *, openmetrics: bool = False) -> bytes:
        """The registry in Prometheus text format, or in OpenMetrics (which carries the latency
        histograms' exemplars: the trace of a slow delivery, tracing on)."""
        if openmetrics:
            body: bytes = openmetrics_latest(self.registry)  # type: ignore[no-untyped-call]
            return body
        return generate_latest(self.registry)
