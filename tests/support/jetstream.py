"""One JetStream stream each test process keeps for its whole session.

nats-server removes an account's stream directory when its last stream is deleted; a stream
created by another test process at that moment fails ("could not create storage directory",
seen with four xdist workers deleting and creating their streams). While any process holds its
anchor, the directory never empties.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Iterator

NATS_URL = "nats://127.0.0.1:4222"


@contextlib.contextmanager
def anchor_stream() -> Iterator[str | None]:
    """Hold a stream of this process's own until the end (None when NATS does not answer)."""
    import nats

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    name = f"RECEIVER_TEST_ANCHOR_{worker}_{uuid.uuid4().hex[:8]}".upper()

    async def act(create: bool) -> bool:
        try:
            client = await nats.connect(NATS_URL, connect_timeout=2, max_reconnect_attempts=0)
        except Exception:
            return False
        try:
            js = client.jetstream()
            if create:
                await js.add_stream(name=name, subjects=[f"receiver-test-anchor.{name.lower()}"])
            else:
                with contextlib.suppress(Exception):
                    await js.delete_stream(name)
            return True
        finally:
            await client.close()

    held = asyncio.run(act(True))
    try:
        yield name if held else None
    finally:
        if held:
            asyncio.run(act(False))
