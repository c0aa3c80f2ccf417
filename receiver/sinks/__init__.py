"""Sinks: where enriched events go, one module per type. Each type's keys are declared in
:mod:`receiver.config.sink_types`; what the sinks send is built by :mod:`receiver.outbound`."""
