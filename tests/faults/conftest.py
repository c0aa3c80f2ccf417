"""Fixtures for the crash and fault tests: the simulator as upstream."""

from __future__ import annotations

from typing import Any

import pytest

from receiver.simulator import Simulator
from tests.support.faults import API_KEY
from tests.support.upstream import serve_upstream


@pytest.fixture
async def upstream(aiohttp_server: Any) -> Simulator:
    return await serve_upstream(aiohttp_server, api_key=API_KEY, seed=23)
