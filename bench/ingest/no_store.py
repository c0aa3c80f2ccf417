"""``receiver serve`` with a store that keeps nothing: the most any store could let it reach.

Each webhook goes through everything the receiver does (aiohttp, the signature, parsing and
checking the JSON, the event's values, counters, the JSON answer) except being stored:
``add_event`` says "new" at once. Its ratio to the bare handler is the receiver's ceiling on the
machine; the gap between it and the SQLite and Postgres targets is what storing costs there.
A diagnostic for ``bench.ingest`` only, run with a ``memory://`` store (which stays empty)::

    python -m bench.ingest.no_store serve --config config.toml --role intake
"""

from __future__ import annotations

import sys

from receiver.cli import main
from receiver.store.memory import MemoryStore
from receiver.store.records import NewEvent


async def _keep_nothing(self: MemoryStore, event: NewEvent) -> bool:
    return True


if __name__ == "__main__":
    MemoryStore.add_event = _keep_nothing  # type: ignore[method-assign]
    sys.exit(main())
