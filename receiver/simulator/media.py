"""Placeholder media the simulator serves: tiny but valid PNG, MP4/MOV and WebM files.

Each file is deterministic for its asset id and labelled as a placeholder, so a download can be
checked byte for byte and recognised by type.
"""

from __future__ import annotations

import hashlib
import struct
import zlib

#: Asset type -> (content type, file extension).
MEDIA_TYPES: dict[str, tuple[str, str]] = {
    "image": ("image/png", ".png"),
    "transparent_image": ("image/png", ".png"),
    "sticker_image": ("image/png", ".png"),
    "logo": ("image/png", ".png"),
    "scene": ("image/png", ".png"),
    "video": ("video/mp4", ".mp4"),
    "stacked_video": ("video/mp4", ".mp4"),
    "webm": ("video/webm", ".webm"),
    "hevc": ("video/quicktime", ".mov"),
}
CONTENT_TYPES = {
    ".png": "image/png",
    ".mp4": "video/mp4",
    ".webm": "video/webm",
    ".mov": "video/quicktime",
}


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data))
        + kind
        + data
        + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def png_bytes(
    width: int = 8,
    height: int = 8,
    *,
    rgb: tuple[int, int, int] = (240, 160, 40),
    transparent: bool = False,
    label: str = "receiver simulator placeholder image",
) -> bytes:
    """A small valid RGBA PNG: a coloured square (with a transparent ring when asked)."""
    rows = []
    for y in range(height):
        row = bytearray(b"\x00")  # filter type 0 (None) for each scanline
        for x in range(width):
            edge = x in (0, width - 1) or y in (0, height - 1)
            alpha = 0 if transparent and edge else 255
            shade = (x + y) * 4
            row += bytes(
                (min(255, rgb[0] + shade), min(255, rgb[1] + shade), min(255, rgb[2]), alpha)
            )
        rows.append(bytes(row))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)  # 8-bit RGBA
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"tEXt", b"Comment\x00" + label.encode("latin-1", "replace"))
        + _png_chunk(b"IDAT", zlib.compress(b"".join(rows), 9))
        + _png_chunk(b"IEND", b"")
    )


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def isobmff_bytes(*, quicktime: bool = False, label: str) -> bytes:
    """Placeholder MP4/MOV bytes: a real ``ftyp`` box, then the label in a ``free`` box.

    Not playable: there is no ``moov``/``mdat``, only enough for content sniffing.
    """
    if quicktime:
        ftyp = b"qt  " + struct.pack(">I", 0x200) + b"qt  "
    else:
        ftyp = b"isom" + struct.pack(">I", 0x200) + b"isomiso2avc1mp41"
    return _box(b"ftyp", ftyp) + _box(b"free", label.encode())


def _ebml(element_id: bytes, payload: bytes) -> bytes:
    size = len(payload)
    size_bytes = bytes([0x80 | size]) if size < 0x7F else b"\x01" + size.to_bytes(7, "big")
    return element_id + size_bytes + payload


def webm_bytes(*, label: str) -> bytes:
    """Placeholder WebM bytes: a real EBML header (DocType ``webm``), then the label in a Void.

    Not playable: there is no Segment.
    """
    header = b"".join(
        (
            _ebml(b"\x42\x86", b"\x01"),  # EBMLVersion
            _ebml(b"\x42\xf7", b"\x01"),  # EBMLReadVersion
            _ebml(b"\x42\xf2", b"\x04"),  # EBMLMaxIDLength
            _ebml(b"\x42\xf3", b"\x08"),  # EBMLMaxSizeLength
            _ebml(b"\x42\x82", b"webm"),  # DocType
            _ebml(b"\x42\x87", b"\x04"),  # DocTypeVersion
            _ebml(b"\x42\x85", b"\x02"),  # DocTypeReadVersion
        )
    )
    return _ebml(b"\x1a\x45\xdf\xa3", header) + _ebml(b"\xec", label.encode())


def media_for(asset_type: str, asset_id: str) -> tuple[str, str, bytes]:
    """(content type, extension, bytes) for an asset; unknown types are treated as images."""
    content_type, ext = MEDIA_TYPES.get(
        asset_type, ("video/mp4", ".mp4") if "video" in asset_type else ("image/png", ".png")
    )
    label = f"receiver simulator placeholder {asset_type} {asset_id}"
    if ext == ".png":
        digest = hashlib.sha256(asset_id.encode()).digest()
        rgb = (digest[0] // 2 + 64, digest[1] // 2 + 64, digest[2] // 2 + 64)
        data = png_bytes(rgb=rgb, transparent=asset_type == "transparent_image", label=label)
    elif ext == ".webm":
        data = webm_bytes(label=label)
    else:
        data = isobmff_bytes(quicktime=ext == ".mov", label=label)
    return content_type, ext, data
