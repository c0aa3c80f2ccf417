"""The upstream simulator over HTTP: media, signed URLs, derived formats, long-poll, webhooks."""

from __future__ import annotations

import asyncio
import struct
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import pytest
from aiohttp.test_utils import TestClient, TestServer

from receiver.simulator import DERIVED_TYPES, KINDS, Simulator, png_bytes

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


# ------------------------------------------------------------------ media


def test_png_decodes() -> None:
    assert check_png(png_bytes()) == (8, 8)
    assert check_png(png_bytes(3, 5, transparent=True)) == (3, 5)


async def test_image_job_serves_real_pngs(client: TestClient[Any, Any], sim: Simulator) -> None:
    payload = sim.add_job("image")
    for asset_type in ("image", "transparent_image"):
        asset = (await api(client, f"/v1/assets/{payload['asset_ids'][asset_type]}"))["data"]
        assert asset["type"] == asset_type
        assert asset["status"] == "completed"
        status, content_type, data = await fetch(client, asset["file_url"])
        assert (status, content_type) == (200, "image/png")
        assert urlsplit(asset["file_url"]).path.endswith(".png")
        check_png(data)


async def test_animation_formats_have_their_content_types(
    client: TestClient[Any, Any], sim: Simulator
) -> None:
    payload = sim.add_job("animation")
    assert set(payload["asset_ids"]) == {"video", "webm", "hevc", "stacked_video"}
    expected = {"video": ".mp4", "webm": ".webm", "hevc": ".mov", "stacked_video": ".mp4"}
    for asset_type, asset_id in payload["asset_ids"].items():
        asset = (await api(client, f"/v1/assets/{asset_id}"))["data"]
        ext = expected[asset_type]
        assert urlsplit(asset["file_url"]).path.endswith(ext)
        status, content_type, data = await fetch(client, asset["file_url"])
        assert (status, content_type) == (200, EXTENSIONS[ext])
        assert b"placeholder" in data
        if ext == ".webm":
            assert data[:4] == b"\x1a\x45\xdf\xa3" and b"webm" in data
        else:
            assert data[4:8] == b"ftyp"


# ------------------------------------------------------------------ jobs


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_every_kind(client: TestClient[Any, Any], sim: Simulator, kind: str) -> None:
    payload = sim.add_job(kind, item_name="wave")
    assert payload["object"] == "event"
    assert payload["event"] == "job.completed"
    assert set(payload["asset_ids"]) == set(KINDS[kind].asset_types) == set(payload["urls"])

    job = (await api(client, f"/v1/jobs/{payload['job_id']}"))["data"]

    assert job["status"] == "completed"
    assert job["type"] == payload["type"] == KINDS[kind].job_type
    assert job["item_name"] == "wave"
    assert job["collection_id"] == payload["mascot_id"]
    assert job["cost_credits"] == KINDS[kind].cost_credits
    assert set(job["urls"]) == set(payload["asset_ids"])
    for key in ("created_at", "updated_at", "item_id"):
        assert job[key]


async def test_failed_job(client: TestClient[Any, Any], sim: Simulator) -> None:
    payload = sim.add_failed_job("animation", error="the provider timed out")
    assert payload["event"] == "job.failed"

    job = (await api(client, f"/v1/jobs/{payload['job_id']}"))["data"]

    assert job["status"] == "failed"
    assert job["error"] == "the provider timed out"
    assert job["urls"] == {}
    assert sim.add_job("failed")["event"] == "job.failed"


async def test_unknown_ids_are_404(client: TestClient[Any, Any]) -> None:
    body = await api(client, "/v1/jobs/nope", 404)
    assert body["error"]["code"] == "not_found"
    body = await api(client, "/v1/assets/nope", 404)
    assert body["error"]["code"] == "not_found"
    body = await api(client, "/v1/credits-or-whatever", 404)
    assert body["error"]["code"] == "not_found"


async def test_bearer_key_is_checked(client: TestClient[Any, Any], sim: Simulator) -> None:
    job_id = sim.add_job("image")["job_id"]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {API_KEY}"}):
        resp = await client.get(f"/v1/jobs/{job_id}", headers=headers)
        assert resp.status == 401
        assert (await resp.json())["error"]["code"] == "unauthorized"
    assert sim.requests["GET /v1/jobs/{id}"] == 3


async def test_job_pending_for_seconds(
    client: TestClient[Any, Any], sim: Simulator, clock: FakeClock
) -> None:
    sim.job_pending_for_seconds = 30
    payload = sim.add_job("image")
    job_path = f"/v1/jobs/{payload['job_id']}"

    job = (await api(client, job_path))["data"]
    assert job["status"] == "processing"
    assert job["urls"] == {}
    asset = (await api(client, f"/v1/assets/{payload['asset_ids']['image']}"))["data"]
    assert asset["status"] == "processing"
    assert (await fetch(client, asset["file_url"]))[0] == 404

    clock.advance(31)
    assert (await api(client, job_path))["data"]["status"] == "completed"
    assert (await fetch(client, asset["file_url"]))[0] == 200


async def test_derived_formats_lag_behind(
    client: TestClient[Any, Any], sim: Simulator, clock: FakeClock
) -> None:
    sim.derived_delay_seconds = 60
    payload = sim.add_job("animation")

    assert (await api(client, f"/v1/jobs/{payload['job_id']}"))["data"]["status"] == "completed"
    urls = {}
    for asset_type, asset_id in payload["asset_ids"].items():
        asset = (await api(client, f"/v1/assets/{asset_id}"))["data"]
        urls[asset_type] = asset["file_url"]
        derived = asset_type in DERIVED_TYPES
        assert asset["status"] == ("processing" if derived else "completed"), asset_type
        assert (await fetch(client, asset["file_url"]))[0] == (404 if derived else 200)

    clock.advance(61)
    for asset_type, asset_id in payload["asset_ids"].items():
        assert (await api(client, f"/v1/assets/{asset_id}"))["data"]["status"] == "completed"
        # The URL handed out before the file existed works once it does.
        assert (await fetch(client, urls[asset_type]))[0] == 200


# ------------------------------------------------------------------ signed URLs


async def test_signed_urls_expire(
    client: TestClient[Any, Any], sim: Simulator, clock: FakeClock
) -> None:
    asset_id = sim.add_job("logo")["asset_ids"]["logo"]
    first = (await api(client, f"/v1/assets/{asset_id}"))["data"]["file_url"]
    clock.advance(1)
    second = (await api(client, f"/v1/assets/{asset_id}"))["data"]["file_url"]
    assert first != second, "each answer signs a fresh URL"
    query = parse_qs(urlsplit(first).query)
    assert int(query["expires"][0]) == int(clock()) - 1 + 3600
    assert len(query["sig"][0]) == 64

    assert (await fetch(client, first))[0] == 200
    clock.advance(3599.5)  # past the first URL's expiry, not the second's
    status, content_type, _ = await fetch(client, first)
    assert (status, content_type) == (403, "application/xml")
    assert (await fetch(client, second))[0] == 200


async def test_tampered_and_unsigned_urls_are_refused(
    client: TestClient[Any, Any], sim: Simulator
) -> None:
    asset_id = sim.add_job("logo")["asset_ids"]["logo"]
    url = (await api(client, f"/v1/assets/{asset_id}"))["data"]["file_url"]
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    later = f"expires={int(query['expires'][0]) + 10_000}&sig={query['sig'][0]}"
    for bad_query in ("", later, f"expires={query['expires'][0]}&sig={'0' * 64}"):
        bad = urlunsplit((parts.scheme, parts.netloc, parts.path, bad_query, ""))
        assert (await fetch(client, bad))[0] == 403, bad_query


async def test_expired_urls_knob(client: TestClient[Any, Any], sim: Simulator) -> None:
    asset_id = sim.add_job("scene")["asset_ids"]["scene"]
    sim.expired_urls = True
    url = (await api(client, f"/v1/assets/{asset_id}"))["data"]["file_url"]
    assert (await fetch(client, url))[0] == 403
    sim.expired_urls = False
    url = (await api(client, f"/v1/assets/{asset_id}"))["data"]["file_url"]
    assert (await fetch(client, url))[0] == 200
    assert sim.requests["GET /files/{name}"] == 2


# ------------------------------------------------------------------ long-poll


async def test_long_poll_returns_when_the_job_completes(
    client: TestClient[Any, Any], sim: Simulator
) -> None:
    job_id = sim.add_job("animation", status="processing")["job_id"]
    asyncio.get_running_loop().call_later(0.2, sim.complete_job, job_id)

    started = time.monotonic()
    job = (await api(client, f"/v1/jobs/{job_id}?wait=true&timeout=10"))["data"]

    assert job["status"] == "completed"
    assert 0.15 <= time.monotonic() - started < 5


async def test_long_poll_returns_the_current_state_at_the_timeout(
    client: TestClient[Any, Any], sim: Simulator
) -> None:
    job_id = sim.add_job("image", status="processing")["job_id"]
    started = time.monotonic()
    job = (await api(client, f"/v1/jobs/{job_id}?wait=true&timeout=0.2"))["data"]
    assert job["status"] == "processing"
    assert time.monotonic() - started >= 0.19

    sim.fail_job(job_id, "out of credits")
    job = (await api(client, f"/v1/jobs/{job_id}?wait=true&timeout=10"))["data"]
    assert (job["status"], job["error"]) == ("failed", "out of credits")

    body = await api(client, f"/v1/jobs/{job_id}?wait=true&timeout=soon", 400)
    assert body["error"]["code"] == "validation_failed"


async def test_long_poll_ends_when_the_server_stops(sim: Simulator) -> None:
    job_id = sim.add_job("image", status="processing")["job_id"]
    started = time.monotonic()
    async with TestClient(TestServer(sim.create_app())) as client:
        request = asyncio.ensure_future(
            client.get(f"/v1/jobs/{job_id}?wait=true&timeout=100", headers=AUTH)
        )
        await asyncio.sleep(0.1)
        await client.server.close()
        try:
            resp = await request
            resp.release()
        except Exception:
            pass
    assert time.monotonic() - started < 5


# ------------------------------------------------------------------ faults


async def test_fault_knobs(client: TestClient[Any, Any], sim: Simulator) -> None:
    job_id = sim.add_job("image")["job_id"]
    sim.rate_limit_fraction = 1.0
    sim.retry_after = 12
    resp = await client.get(f"/v1/jobs/{job_id}", headers=AUTH)
    assert resp.status == 429
    assert resp.headers["Retry-After"] == "12"
    assert (await resp.json())["error"]["code"] == "rate_limited"

    sim.rate_limit_fraction = 0.0
    sim.error_fraction = 1.0
    sim.error_status = 503
    resp = await client.get(f"/v1/jobs/{job_id}", headers=AUTH)
    assert resp.status == 503
    body = await resp.json()
    assert body["error"]["code"] == "upstream_error"
    assert body["error"]["request_id"] == resp.headers["Request-Id"]

    sim.error_fraction = 0.0
    sim.latency_seconds = 0.2
    started = time.monotonic()
    await api(client, f"/v1/jobs/{job_id}")
    assert time.monotonic() - started >= 0.19
    assert sim.requests["GET /v1/jobs/{id}"] == 3


async def test_fractions_are_deterministic_per_seed() -> None:
    def outcomes(seed: int) -> list[bool]:
        sim = Simulator(seed=seed)
        sim.rate_limit_fraction = 0.3
        return [sim._roll(sim.rate_limit_fraction) for _ in range(50)]

    assert outcomes(1) == outcomes(1)
    assert 5 <= sum(outcomes(1)) <= 25


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
