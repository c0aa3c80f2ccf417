"""What the spec-conformance tests share: the spec's minimal objects and the receiver under test.

The upstream is hand-written (:mod:`tests.support.spec_upstream`); each test writes the JSON of
the webhook body, job, asset, collection page or error body in the minimal form
``upstream-api-spec.md`` allows (only required fields; nullable ones null) with
``minimal_body``, ``minimal_job`` and ``minimal_asset``. The ``stack`` fixture runs the real
receiver (intake, worker, sinks, poller) against it, with an http and a chat sink posting to
capture servers; a test module imports ``stack`` by name (and lists it in ``__all__``).
Used by tests/integration/test_spec_conformance_*.py.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.store.records import EventRecord
from tests.support.peers import Capture
from tests.support.pull import API_KEY, receiver_config
from tests.support.spec_upstream import (
    SpecUpstream,
    serve_spec_upstream,
)

JOB = "8d3c6f0e-2b1a-4c5d-9e8f-7a6b5c4d3e2f"
ASSET = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
DERIVED = "5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a8b"  # a derived format (hevc) of the same job
COLLECTION = "c0ffee00-1111-4222-8333-444455556666"
ITEM = "17e40000-aaaa-4bbb-8ccc-ddddeeeeffff"
CREATED = "2026-05-01T10:00:00+00:00"
UPDATED = "2026-05-01T10:00:42+00:00"
PNG = b"\x89PNG\r\n\x1a\n" + b"spec conformance" * 8
PROXY_PAGE = "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
ALL_SINKS = ("files", "forward", "chat")


# -- the spec's minimal objects ---------------------------------------------------------------


def minimal_body(event: str, job_id: str = JOB, **more: Any) -> dict[str, Any]:
    """A webhook body with only what the spec guarantees: id, object, event, job_id."""
    return {"id": str(uuid.uuid4()), "object": "event", "event": event, "job_id": job_id, **more}


def minimal_job(status: str, job_id: str = JOB, **more: Any) -> dict[str, Any]:
    """A Job with only its required fields (collection_id is required and nullable)."""
    return {
        "id": job_id,
        "status": status,
        "type": "image_generation",
        "collection_id": None,
        "cost_credits": 1,
        "created_at": CREATED,
        "updated_at": UPDATED,
        **more,
    }


def minimal_asset(
    asset_id: str, file_url: str | None, *, status: str = "completed", **more: Any
) -> dict[str, Any]:
    """An Asset with only its required fields (item_id, file_url, cdn_url nullable)."""
    return {
        "id": asset_id,
        "type": "image",
        "status": status,
        "item_id": None,
        "file_url": file_url,
        "cdn_url": None,
        "created_at": CREATED,
        **more,
    }


#: The Job's optional fields the receiver reads, each nullable but ``urls``.
JOB_OPTIONAL_NULL = {"item_id": None, "item_name": None, "error": None}
#: The Asset's optional fields, null where the spec allows it (is_archived is not nullable).
ASSET_OPTIONAL_NULL = {"metadata": None, "collection_id": None, "archived_at": None}


# -- the receiver under test ------------------------------------------------------------------


@dataclass
class Stack:
    runtime: Runtime
    public: Any
    ops: Any
    upstream: SpecUpstream
    forward: Capture
    chat: Capture
    logs: list[dict[str, Any]]
    downloads: Path

    def forwarded(self) -> list[dict[str, Any]]:
        """The enriched events the http sink posted."""
        return [json.loads(r.body) for r in self.forward.requests]

    def chat_texts(self) -> list[str]:
        return [json.loads(r.body)["text"] for r in self.chat.requests]

    def files(self) -> dict[str, bytes]:
        """Every file the download sink wrote, by its path under the directory."""
        root = self.downloads
        if not root.exists():
            return {}
        return {
            p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file()
        }

    def logged(self, event: str) -> list[dict[str, Any]]:
        return [entry for entry in self.logs if entry["event"] == event]

    async def record(self, event_id: str) -> EventRecord:
        record = await self.runtime.store.get(event_id)
        assert record is not None
        return record

    async def states(self, event_id: str) -> dict[str, tuple[str, int]]:
        record = await self.record(event_id)
        return {d.sink: (d.state, d.attempts) for d in record.deliveries}


async def capture_server(aiohttp_server: Any) -> Capture:
    capture = Capture()
    server = await aiohttp_server(capture.app())
    capture.url = str(server.make_url("/hook"))
    return capture


@pytest.fixture
async def stack(aiohttp_server, aiohttp_client, tmp_path):
    upstream = await serve_spec_upstream(aiohttp_server)
    forward, chat = await capture_server(aiohttp_server), await capture_server(aiohttp_server)
    data = receiver_config(
        tmp_path,
        upstream,  # only its base_url is read
        api={
            "base_url": upstream.base_url,
            "api_key": API_KEY,
            "timeout_seconds": 5,
            "watchdog_interval_seconds": 0,
        },
        pull={"wait_seconds": 1},
    )
    data["sinks"] += [
        {"name": "forward", "type": "http", "url": forward.url, "secret": "s" * 24},
        {"name": "chat", "type": "slack", "url": chat.url, "rate_limit_per_second": 0},
    ]
    runtime = Runtime(parse_settings(data, env={}))
    with capture_logs() as logs:
        async with runtime:
            public = await aiohttp_client(runtime.public_app())
            ops = await aiohttp_client(runtime.ops_app())
            yield Stack(runtime, public, ops, upstream, forward, chat, logs, tmp_path / "dl")
