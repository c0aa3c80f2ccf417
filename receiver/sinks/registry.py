"""What each sink type is called, where it lives and which keys its config table takes.

This module imports nothing heavy: config validation uses it without loading any broker library.
A sink module is imported only when a config names its type
(see :func:`receiver.sinks.loader.build_sinks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Option:
    """One key of a sink's config table."""

    kind: type | tuple[type, ...]
    required: bool = False
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] = ()
    item_kind: type | None = None  # element type when ``kind`` is list


@dataclass(frozen=True)
class SinkType:
    """A sink type: the module implementing it, the extra it needs, and its own keys."""

    module: str
    options: dict[str, Option] = field(default_factory=dict)
    extra: str | None = None  # pip extra, e.g. "redis"
    import_name: str | None = None  # the library the extra provides


# Keys every [[sinks]] table may carry, whatever its type.
COMMON_KEYS: dict[str, Option] = {
    "name": Option(str, required=True, help="unique name of this sink"),
    "type": Option(str, required=True, help="sink type"),
    "events": Option(list, item_kind=str, default=(), help="event names; default all"),
    "job_types": Option(list, item_kind=str, default=(), help="upstream job types; default all"),
    "max_attempts": Option(int, help="attempts before dead; default [worker].max_attempts"),
    "concurrency": Option(int, help="deliveries in flight; default [worker].concurrency"),
    "timeout_seconds": Option((int, float), default=60.0, help="limit for one delivery"),
}

SINK_TYPES: dict[str, SinkType] = {
    "download": SinkType(
        module="receiver.sinks.download",
        options={
            "directory": Option(str, default="data/downloads", help="where files are written"),
            "allow_private_networks": Option(
                bool, default=False, help="allow file URLs on private/loopback addresses"
            ),
            "max_file_bytes": Option(int, default=1024 * 1024 * 1024, help="largest file"),
        },
    ),
}
