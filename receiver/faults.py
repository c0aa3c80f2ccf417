"""Crash points for the crash tests: inert unless ``RECEIVER_FAULT_INJECT`` is set.

``RECEIVER_FAULT_INJECT=<point>[:<n>]`` makes the process exit at once (``os._exit``, no cleanup,
no flushing: as close to ``kill -9`` as a process can do to itself) the ``n``-th time (default: the
first) it reaches ``<point>``. The tests use it to crash at the moments a random SIGKILL
rarely hits:

- ``after_commit``: intake has committed an event and not yet sent the 2xx (the upstream retries,
  and the retry must be acknowledged as a duplicate, not stored twice);
- ``after_sink_success``: a sink has delivered and the delivery is not yet settled (the event is
  delivered again after the restart: at-least-once, and the redelivery must be harmless);
- ``mid_migration``: a schema migration has run and the transaction holding every pending one
  is not yet committed (the inbox must keep its old version, and the next run migrate it).

Before exiting, one line ``fault injected: <point>`` goes to stderr. An unknown point name stops
the process at start-up with exit code 2. Never set this variable in production.
"""

from __future__ import annotations

import os
import sys

ENV_VAR = "RECEIVER_FAULT_INJECT"
POINTS = frozenset({"after_commit", "after_sink_success", "mid_migration"})
EXIT_CODE = 86


def _parse(value: str) -> tuple[str, int] | None:
    point, _, count = value.strip().partition(":")
    if not point:
        return None
    if point not in POINTS or (count and (not count.isdigit() or int(count) < 1)):
        sys.stderr.write(
            f"receiver: {ENV_VAR}={value!r}: expected one of {', '.join(sorted(POINTS))}, "
            "optionally followed by :N (N >= 1)\n"
        )
        sys.stderr.flush()
        os._exit(2)
    return point, int(count or 1)


_armed = _parse(os.environ.get(ENV_VAR, ""))
_seen = 0


def reached(point: str) -> None:
    """Exit the process here if ``point`` is the armed crash point and its turn has come."""
    global _seen
    if _armed is None or _armed[0] != point:
        return
    _seen += 1
    if _seen >= _armed[1]:
        os.write(2, f"fault injected: {point}\n".encode())
        os._exit(EXIT_CODE)
