"""Where metrics and traces are made: the Prometheus metrics (:mod:`.metrics`, the event loop's
in :mod:`.loop_metrics`), OpenTelemetry traces (:mod:`.tracing`) and each event's timeline of
steps (:mod:`.timeline`). Logging is :mod:`receiver.logs`."""
