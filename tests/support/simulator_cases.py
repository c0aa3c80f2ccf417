"""What the simulator's own tests share: a simulator on a fake clock, served, and readers.

The fixtures ``clock``, ``sim`` and ``client`` give a test module a ``FakeClock``, the simulator
on it (every field shown) and a test client of its app; a test module imports them by name (and
lists them in ``__all__``). ``api`` and ``fetch`` read its API and its files; ``check_png``
decodes a PNG by hand. Used by tests/integration/test_simulator_{media,jobs,webhooks}.py.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from receiver.simulator import Simulator

API_KEY = "service_" + "12" * 32
AUTH = {"Authorization": f"Bearer {API_KEY}"}
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXTENSIONS = {
    ".png": "image/png",
    ".mp4": "video/mp4",
    ".webm": "video/webm",
    ".mov": "video/quicktime",
}


class FakeClock:
    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sim(clock: FakeClock) -> Simulator:
    # The simulator's own behaviour with every field shown; its shapes are tested in
    # tests/integration/test_simulate.py, the receiver against them everywhere else.
    return Simulator(api_key=API_KEY, seed=3, now=clock, shape="full")


@pytest.fixture
async def client(sim: Simulator) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(sim.create_app())) as client:
        yield client


async def api(client: TestClient[Any, Any], path: str, status: int = 200) -> Any:
    resp = await client.get(path, headers=AUTH)
    body = await resp.json()
    assert resp.status == status, body
    return body


async def fetch(client: TestClient[Any, Any], url: str) -> tuple[int, str, bytes]:
    async with client.session.get(url) as resp:
        return resp.status, resp.content_type, await resp.read()


def check_png(data: bytes) -> tuple[int, int]:
    """Decode a PNG by hand: signature, CRCs, IHDR, IDAT (zlib) and IEND."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks, idat = 8, [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc, kind
        chunks.append(kind)
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert (depth, colour) == (8, 6)
        if kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND" and b"IDAT" in chunks
    raw = zlib.decompress(idat)
    assert len(raw) == height * (1 + width * 4)
    assert all(raw[row * (1 + width * 4)] == 0 for row in range(height))
    return width, height
