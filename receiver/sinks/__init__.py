"""Sinks: where enriched events go. One module per type; see :mod:`receiver.sinks.registry`."""
