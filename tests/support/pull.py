"""What the pull-mode tests share: the simulator as upstream, a receiver config, a webhook."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from receiver.signature import webhook_headers
from receiver.simulator import Simulator
from receiver.simulator.shape import DEFAULT_SHAPE, ShapeName
from tests.support.helpers import free_port, wait_for

SECRET = "whsec_pull"
API_KEY = "service_" + "cd" * 32


async def serve_simulator(
    aiohttp_server: Any, *, seed: int, shape: ShapeName = DEFAULT_SHAPE
) -> Simulator:
    """A simulator served over real HTTP; its ``base_url`` set."""
    sim = Simulator(api_key=API_KEY, seed=seed, shape=shape)
    server = await aiohttp_server(sim.create_app())
    sim.base_url = str(server.make_url("/v1"))
    return sim


def receiver_config(tmp_path: Path, sim: Simulator, **sections: Any) -> dict[str, Any]:
    """A config (as a dict) on a SQLite inbox in ``tmp_path``, fast retries and a download
    sink ``files`` writing to ``tmp_path / "dl"``; ``sections`` add or replace tables."""
    return {
        "webhook": {"secrets": [SECRET]},
        "api": {"base_url": sim.base_url, "api_key": API_KEY, "timeout_seconds": 5},
        "store": {"url": f"sqlite:///{tmp_path}/inbox.db"},
        "worker": {
            "backoff_initial_seconds": 0.05,
            "backoff_max_seconds": 0.2,
            "poll_interval_seconds": 0.05,
        },
        "admin": {"port": free_port()},
        "sinks": [
            {
                "name": "files",
                "type": "download",
                "directory": str(tmp_path / "dl"),
                "allow_private_networks": True,
            }
        ],
        **sections,
    }


async def send_webhook(client: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """POST ``payload`` signed as the upstream does; assert a 200; the answer."""
    body = json.dumps(payload).encode()
    headers = webhook_headers(
        SECRET, body, int(time.time()), event_id=payload["id"], event_name=payload["event"]
    )
    response = await client.post("/webhooks", data=body, headers=headers)
    assert response.status == 200, await response.text()
    answer: dict[str, Any] = await response.json()
    return answer


async def idle(runtime: Any, timeout: float = 30.0) -> None:
    """Wait until the inbox has no event pending (every delivery done, dead or skipped)."""

    async def no_pending() -> bool:
        counts, _oldest = await runtime.store.counts()
        return bool(counts["pending"] == 0)

    await wait_for(no_pending, timeout, what="every event processed")


def metric(runtime: Any, name: str, labels: dict[str, str] | None = None) -> float:
    value = runtime.metrics.registry.get_sample_value(name, labels or {})
    return float(value or 0.0)


def successes(runtime: Any, sink: str = "files") -> float:
    """Sends the sink completed (each a whole event's files)."""
    return metric(runtime, "receiver_sink_deliveries_total", {"sink": sink, "outcome": "success"})
