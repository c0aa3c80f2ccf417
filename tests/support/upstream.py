"""The upstream stand-in for tests: the simulator served on a real aiohttp test server."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from receiver.simulator import DEFAULT_API_KEY, Simulator
from receiver.simulator.shape import PRESENT


async def serve_upstream(
    aiohttp_server: Any,
    *,
    api_key: str = DEFAULT_API_KEY,
    seed: int = 0,
    middlewares: Iterable[Any] = (),
) -> Simulator:
    """A :class:`Simulator` served by pytest-aiohttp's ``aiohttp_server``, its ``base_url`` set.

    ``middlewares`` run after the simulator's own (e.g. an outage switch).
    """
    sim = Simulator(api_key=api_key, seed=seed)
    app = sim.create_app()
    app.middlewares.extend(middlewares)
    server = await aiohttp_server(app)
    sim.base_url = str(server.make_url("/v1"))
    return sim


def rely_on(sim: Simulator, **fields: Iterable[str]) -> None:
    """Make the named optional fields always present (``event=["asset_ids"], job=["urls"]``),
    for a test about the path those fields lead to; the minimal forms the spec allows are
    tested in tests/integration/test_spec_conformance_*.py."""
    for kind, names in fields.items():
        for name in names:
            sim.shape.pin(kind, name, PRESENT)
