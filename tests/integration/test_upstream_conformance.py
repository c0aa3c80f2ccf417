"""The API client checks every job, asset and collection asset page it fetches from a
hand-written upstream, and hands each on unchanged."""

from __future__ import annotations

import aiohttp

from receiver.observe.metrics import Metrics
from receiver.upstream.client import UpstreamClient
from tests.support.openapi_upstream import serve_openapi_upstream


def invalid(metrics: Metrics, kind: str, field: str) -> float | None:
    return metrics.registry.get_sample_value(
        "receiver_upstream_invalid_total", {"object": kind, "field": field}
    )


async def test_the_client_checks_what_it_fetches_and_hands_it_on(aiohttp_server) -> None:
    upstream = await serve_openapi_upstream(aiohttp_server)
    upstream.jobs["j1"] = {"id": "j1", "status": "queued", "type": "logo"}
    upstream.assets["a1"] = {"id": "a1", "type": "image", "status": "completed", "file_url": 5}
    page = [{"id": "a2", "type": "image", "status": 1}]
    upstream.pages["c1"] = (page, {"total": 1, "limit": 100, "offset": 0, "has_more": False})
    metrics = Metrics()
    async with aiohttp.ClientSession() as session:
        client = UpstreamClient(
            session=session, base_url=upstream.base_url, api_key="k", timeout=5, metrics=metrics
        )
        assert await client.get_job("j1") == upstream.jobs["j1"]
        assert await client.get_asset("a1") == upstream.assets["a1"]
        fetched, pagination = await client.collection_assets_page("c1")
    assert fetched == page and pagination["total"] == 1
    assert invalid(metrics, "job", "status") == 1
    assert invalid(metrics, "job", "collection_id") == 1  # required, absent
    assert invalid(metrics, "asset", "file_url") == 1
    assert invalid(metrics, "asset page", "data[].status") == 1
    assert invalid(metrics, "asset page", "meta.pagination.total") is None
