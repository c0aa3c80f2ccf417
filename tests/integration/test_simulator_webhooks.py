"""The upstream simulator over HTTP: webhook endpoints and adopted webhook bodies.

Creating, listing and deleting webhooks (creation validated), and adopting the example webhook
bodies (every one served with its job, assets and files; adopting is idempotent).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from aiohttp.test_utils import TestClient

from receiver.simulator import Simulator
from tests.support.simulator_cases import (
    AUTH,
    EXAMPLES,
    EXTENSIONS,
    api,
    check_png,
    client,
    clock,
    fetch,
    sim,
)

__all__ = ["client", "clock", "sim"]  # fixtures, used by name


# ------------------------------------------------------------------ webhooks


async def test_webhooks_crud(client: TestClient[Any, Any], sim: Simulator) -> None:
    resp = await client.post(
        "/v1/webhooks",
        json={"url": "https://example.com/hook", "events": ["job.failed"]},
        headers=AUTH,
    )
    assert resp.status == 201
    created = (await resp.json())["data"]
    assert created["secret"].startswith("whsec_")
    int(created["secret"].removeprefix("whsec_"), 16)
    assert created["events"] == ["job.failed"]
    assert created["url"] == "https://example.com/hook"
    assert sim.webhooks[created["id"]].secret == created["secret"]

    resp = await client.post(
        "/v1/webhooks", json={"url": "http://localhost:8080/webhooks"}, headers=AUTH
    )
    assert resp.status == 201
    local = (await resp.json())["data"]
    assert local["events"] == ["job.completed", "job.failed"]

    body = await api(client, "/v1/webhooks")
    assert [hook["id"] for hook in body["data"]] == [created["id"], local["id"]]
    assert all("secret" not in hook for hook in body["data"])
    assert body["data"][0]["active"] is True
    assert body["data"][0]["consecutive_failures"] == 0
    assert body["meta"]["pagination"] == {"total": 2, "limit": 50, "offset": 0, "has_more": False}
    page = await api(client, "/v1/webhooks?limit=1")
    assert page["meta"]["pagination"]["has_more"] is True

    resp = await client.delete(f"/v1/webhooks/{created['id']}", headers=AUTH)
    assert resp.status == 204
    assert await resp.read() == b""
    resp = await client.delete(f"/v1/webhooks/{created['id']}", headers=AUTH)
    assert resp.status == 404
    assert [hook["id"] for hook in (await api(client, "/v1/webhooks"))["data"]] == [local["id"]]


@pytest.mark.parametrize(
    "body",
    [
        {"url": "http://example.com/hook"},
        {"url": "ftp://example.com/hook"},
        {"url": "https://"},
        {"url": 3},
        {},
        {"url": "https://example.com/hook", "events": ["job.started"]},
        {"url": "https://example.com/hook", "events": []},
        ["https://example.com/hook"],
    ],
)
async def test_webhook_creation_is_validated(client: TestClient[Any, Any], body: Any) -> None:
    resp = await client.post("/v1/webhooks", json=body, headers=AUTH)
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == "validation_failed"


# ------------------------------------------------------------------ adopt


async def test_adopt_every_example(client: TestClient[Any, Any], sim: Simulator) -> None:
    payloads = sim.load_examples(EXAMPLES)
    assert len(payloads) == 5

    for payload in payloads:
        for key in ("id", "object", "event", "job_id", "type", "mascot_id", "timestamp"):
            assert isinstance(payload[key], str), key
        job = (await api(client, f"/v1/jobs/{payload['job_id']}"))["data"]
        assert job["id"] == payload["job_id"]
        assert job["type"] == payload["type"]
        assert job["collection_id"] == payload["mascot_id"]
        if payload["event"] == "job.failed":
            assert job["status"] == "failed"
            assert job["error"]
            continue
        assert job["status"] == "completed"
        assert set(job["urls"]) == set(payload["asset_ids"])
        for asset_type, asset_id in payload["asset_ids"].items():
            asset = (await api(client, f"/v1/assets/{asset_id}"))["data"]
            assert (asset["id"], asset["type"], asset["status"]) == (
                asset_id,
                asset_type,
                "completed",
            )
            ext = Path(urlsplit(asset["file_url"]).path).suffix
            status, content_type, data = await fetch(client, asset["file_url"])
            assert (status, content_type) == (200, EXTENSIONS[ext])
            if ext == ".png":
                check_png(data)
            # The webhook's own URL names the same kind of file.
            assert urlsplit(payload["urls"][asset_type]).path.endswith(ext)

    animation = next(
        p for p in payloads if p["type"] == "animation" and p["event"] == "job.completed"
    )
    assert set(animation["asset_ids"]) == {"video", "webm", "hevc", "stacked_video"}
    assert {p["event"] for p in payloads} == {"job.completed", "job.failed"}


def test_adopt_is_idempotent_and_keeps_event_ids(sim: Simulator) -> None:
    payload = sim.add_job("image")
    other = Simulator(seed=99, shape="full")
    assert other.adopt(payload) == payload["job_id"]
    assert other.adopt(payload) == payload["job_id"]
    assert len(other.jobs) == 1 and len(other.assets) == 2
    assert other.payload_for(payload["job_id"])["id"] == payload["id"]
    assert other.payload_for(payload["job_id"])["asset_ids"] == payload["asset_ids"]
    with pytest.raises(ValueError, match="job_id"):
        other.adopt({"id": "x", "object": "event", "event": "job.completed"})
