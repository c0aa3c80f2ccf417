"""The download sink against a real aiohttp server: the paths it writes.

The contract path and the extension from the content type (or the URL), stand-ins for a missing
collection or item, one log line per file without the query string, a redelivery rewriting the
same single file, and hostile names that never leave the directory.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tests.support.download_sink_cases import (
    Files,
    SinkFactory,
    base,
    downloads,
    files,
    files_under,
    make_sink,
    server,
)
from tests.support.downloads import PNG, enriched, ref

__all__ = ["base", "downloads", "files", "make_sink", "server"]  # fixtures, used by name


# --- writing files ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "ext"),
    [
        ("image/png", ".png"),
        ("image/jpeg", ".jpg"),
        ("image/webp", ".webp"),
        ("image/gif", ".gif"),
        ("video/mp4", ".mp4"),
        ("video/webm", ".webm"),
        ("video/quicktime", ".mov"),
    ],
)
async def test_writes_the_contract_path_with_the_content_types_extension(
    make_sink: SinkFactory, base: str, downloads: Path, content_type: str, ext: str
) -> None:
    sink = await make_sink(allow_private_networks=True)
    await sink.send(enriched(ref(f"{base}/file?ct={content_type}&sig=secret")))
    expected = downloads / "col_1" / "hero" / f"image-ast_1{ext}"
    assert files_under(downloads) == [expected]
    assert expected.read_bytes() == PNG
    assert sink.bytes_written == len(PNG)
    assert sink.files_written == 1


async def test_octet_stream_takes_a_known_suffix_from_the_url(
    make_sink: SinkFactory, base: str, downloads: Path
) -> None:
    sink = await make_sink(allow_private_networks=True)
    await sink.send(
        enriched(
            ref(f"{base}/octet/clip.webm?sig=x", asset_type="loop", asset_id="a1"),
            ref(f"{base}/octet/tool.exe", asset_type="loop", asset_id="a2"),
        )
    )
    folder = downloads / "col_1" / "hero"
    assert files_under(downloads) == [folder / "loop-a1.webm", folder / "loop-a2.bin"]


async def test_missing_collection_and_item_have_stand_ins(
    make_sink: SinkFactory, base: str, downloads: Path
) -> None:
    sink = await make_sink(allow_private_networks=True)
    await sink.send(enriched(ref(f"{base}/file", collection_id=None, item_name=None)))
    assert files_under(downloads) == [
        downloads / "_unknown-collection" / "_unnamed" / "image-ast_1.png"
    ]


async def test_logs_one_line_per_file_without_the_query_string(
    make_sink: SinkFactory, base: str
) -> None:
    sink = await make_sink(allow_private_networks=True)
    with capture_logs() as logs:
        await sink.send(enriched(ref(f"{base}/file?sig=topsecret")))
    written = [e for e in logs if e["event"] == "file written"]
    assert len(written) == 1
    line = written[0]
    assert line["path"] == os.path.join("col_1", "hero", "image-ast_1.png")
    assert line["bytes"] == len(PNG)
    assert line["asset_type"] == "image"
    assert "topsecret" not in repr(logs)


async def test_redelivery_rewrites_the_same_single_file(
    make_sink: SinkFactory, base: str, downloads: Path, files: Files
) -> None:
    sink = await make_sink(allow_private_networks=True)
    event = enriched(ref(f"{base}/versioned", asset_type="loop"))
    await sink.send(event)
    files.version = b"v2-longer"
    await sink.send(event)
    target = downloads / "col_1" / "hero" / "loop-ast_1.mp4"
    assert files_under(downloads) == [target]
    assert target.read_bytes() == b"v2-longer"
    assert files.hits["/versioned"] == 2


# --- hostile names -------------------------------------------------------------------------

HOSTILE = ["..", "../../etc", "/abs", "/", "a/b", "a\\b", "nul\x00byte", "x" * 500, "CON", "", "."]


@pytest.mark.parametrize("hostile", HOSTILE)
async def test_hostile_names_never_leave_the_directory(
    make_sink: SinkFactory, base: str, tmp_path: Path, downloads: Path, hostile: str
) -> None:
    sink = await make_sink(allow_private_networks=True)
    event = enriched(
        ref(f"{base}/file", collection_id=hostile, asset_id="c"),
        ref(f"{base}/file", item_name=hostile, asset_id="i"),
        ref(f"{base}/file", asset_type=hostile, asset_id="t"),
        ref(f"{base}/file", asset_id=hostile),
        ref(f"{base}/file", collection_id=hostile, item_name=hostile, asset_type=hostile),
    )
    await sink.send(event)
    everything = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert everything, "files were written"
    root = downloads.resolve()
    for path in everything:
        resolved = path.resolve()
        assert resolved.is_relative_to(root), path
        relative = resolved.relative_to(root)
        assert len(relative.parts) == 3, relative
        assert all(part not in ("", ".", "..") for part in relative.parts)
        assert all(len(part.encode()) <= 255 for part in relative.parts)
    assert sink.files_written == 5
