"""Creating the configured sinks: each type's module is imported only when a config names it."""

from __future__ import annotations

import importlib
import importlib.util

from receiver.config.settings import Settings, SinkSettings
from receiver.config.sink_types import SINK_TYPES
from receiver.errors import ConfigError
from receiver.extras import install_hint
from receiver.sinks.base import Sink, SinkContext


def missing_extras(settings: Settings) -> list[str]:
    """One problem line per sink whose optional library is not installed."""
    problems = []
    for sink in settings.sinks:
        spec = SINK_TYPES[sink.type]
        if spec.import_name and importlib.util.find_spec(spec.import_name) is None:
            problems.append(
                f"sinks.{sink.name}.type: the {sink.type} sink needs an optional library; "
                + install_hint(str(spec.extra))
            )
    return problems


def build_sink(sink: SinkSettings, context: SinkContext) -> Sink:
    """Import the sink's module (only now) and create the sink."""
    spec = SINK_TYPES[sink.type]
    try:
        module = importlib.import_module(spec.module)
    except ImportError as exc:
        raise ConfigError(
            f"sinks.{sink.name}.type: the {sink.type} sink cannot be loaded ({exc}); "
            + install_hint(str(spec.extra))
        ) from None
    created: Sink = module.create(sink, context)
    return created


def build_sinks(context: SinkContext) -> list[Sink]:
    """Every configured sink, created but not yet opened."""
    problems = missing_extras(context.settings)
    if problems:
        raise ConfigError(problems)
    return [build_sink(sink, context) for sink in context.settings.sinks]
