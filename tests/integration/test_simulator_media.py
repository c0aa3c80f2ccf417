"""The upstream simulator over HTTP: the media it serves and its signed URLs.

Real PNGs, each animation format with its content type, and signed file URLs that expire, refuse
tampering and follow the expired-URLs knob.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from aiohttp.test_utils import TestClient

from receiver.simulator import Simulator, png_bytes
from tests.support.simulator_cases import (
    EXTENSIONS,
    FakeClock,
    api,
    check_png,
    client,
    clock,
    fetch,
    sim,
)

__all__ = ["client", "clock", "sim"]  # fixtures, used by name


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
