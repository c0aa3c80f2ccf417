"""What the download-sink tests share: an event naming files, file refs, the loopback rule."""

from __future__ import annotations

import ipaddress
import socket

from aiohttp.abc import AbstractResolver, ResolveResult

from receiver.events import Enriched, FileRef
from receiver.netguard import IPAddress, is_public_address

#: A small PNG-looking body (the signature and some bytes).
PNG = b"\x89PNG\r\n\x1a\n" + b"p" * 5000
LOOPBACK = ipaddress.ip_address("127.0.0.1")


def enriched(*files: FileRef) -> Enriched:
    return Enriched(
        event_id="evt_1",
        event_name="job.completed",
        payload={"id": "evt_1", "object": "event", "event": "job.completed", "job_id": "job_1"},
        job={"id": "job_1", "status": "completed"},
        assets=(),
        files=files,
        received_at=0.0,
        processed_at=0.0,
    )


def ref(
    url: str,
    *,
    asset_type: str = "image",
    asset_id: str = "ast_1",
    collection_id: str | None = "col_1",
    item_name: str | None = "hero",
) -> FileRef:
    return FileRef(asset_type, asset_id, url, collection_id, item_name)


def loopback_is_public(ip: IPAddress) -> bool:
    """Treats the test server's 127.0.0.1 as public; every other private address stays refused."""
    return ip == LOOPBACK or is_public_address(ip)


class MapResolver(AbstractResolver):
    """Resolves made-up names to chosen addresses (a DNS answer the attacker controls)."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.closed = False

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host not in self.answers:
            raise OSError(f"unknown host {host}")
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=0,
            )
            for address in self.answers[host]
        ]

    async def close(self) -> None:
        self.closed = True
