"""Path components from the payload are rewritten so that they can never leave the directory."""

from __future__ import annotations

import os
from pathlib import PurePosixPath, PureWindowsPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from receiver.events import FileRef
from receiver.retry import parse_retry_after
from receiver.sinks.download import (
    MAX_COMPONENT_BYTES,
    UNKNOWN_COLLECTION,
    UNNAMED_ITEM,
    extension_for,
    file_parts,
    safe_component,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("hero", "hero"),
        ("Mascot Pose 1", "Mascot Pose 1"),
        ("héros-été", "héros-été"),
        ("", "_"),
        ("   ", "_"),
        (".", "_"),
        ("..", "__"),
        ("...", "___"),
        ("../../etc", "___.._etc"),
        ("/abs", "_abs"),
        ("a/b", "a_b"),
        ("a\\b", "a_b"),
        ("a\x00b", "a_b"),
        ("line\nbreak\r", "line_break_"),
        ("tab\there", "tab_here"),
        ("\u202egnp.exe", "_gnp.exe"),
        ("C:\\Windows", "C__Windows"),
        ("CON", "_CON"),
        ("con", "_con"),
        ("nul.txt", "_nul.txt"),
        ("COM1", "_COM1"),
        ("lpt9.png", "_lpt9.png"),
        ("CONSOLE", "CONSOLE"),
        ("trailing. . ", "trailing"),
        (".hidden", "_hidden"),
        ('a<b>c:d"e|f?g*h', "a_b_c_d_e_f_g_h"),
    ],
)
def test_examples(raw: str, expected: str) -> None:
    assert safe_component(raw) == expected


def test_long_names_are_cut_with_a_hash() -> None:
    a = safe_component("a" * 500)
    b = safe_component("a" * 499 + "b")
    assert len(a.encode()) <= MAX_COMPONENT_BYTES
    assert a != b
    assert a.startswith("a" * 80)
    # Multi-byte characters are never split.
    wide = safe_component("é" * 300)
    assert len(wide.encode()) <= MAX_COMPONENT_BYTES
    wide.encode("utf-8", "strict")


def test_exactly_the_limit_is_kept() -> None:
    assert safe_component("x" * MAX_COMPONENT_BYTES) == "x" * MAX_COMPONENT_BYTES


def test_file_parts_fallbacks() -> None:
    ref = FileRef("image", "ast_1", "https://x/y", None, None)
    assert file_parts(ref) == (UNKNOWN_COLLECTION, UNNAMED_ITEM, "image-ast_1")
    ref = FileRef("../x", "", "https://x/y", "", "")
    assert file_parts(ref) == (UNKNOWN_COLLECTION, UNNAMED_ITEM, "___x-_")


@given(st.text())
def test_any_text_gives_one_safe_component(text: str) -> None:
    name = safe_component(text)
    assert name
    assert name not in (".", "..")
    assert "/" not in name
    assert "\\" not in name
    assert "\x00" not in name
    assert not name.startswith(".")
    assert len(name.encode("utf-8")) <= MAX_COMPONENT_BYTES
    assert safe_component(name) == name  # idempotent: a sanitised name stays as it is

    base = "/srv/downloads"
    joined = os.path.normpath(os.path.join(base, name))
    assert os.path.dirname(joined) == base
    assert PurePosixPath(base, name).parent == PurePosixPath(base)
    assert PureWindowsPath("C:\\downloads", name).parent == PureWindowsPath("C:\\downloads")


@given(st.text(), st.text(), st.text(), st.text())
def test_any_file_ref_stays_three_levels_under_the_base(
    asset_type: str, asset_id: str, collection: str, item: str
) -> None:
    collection_name, item_name, stem = file_parts(
        FileRef(asset_type, asset_id, "https://x/", collection, item)
    )
    base = "/srv/downloads"
    joined = os.path.normpath(os.path.join(base, collection_name, item_name, stem + ".png"))
    assert os.path.commonpath([base, joined]) == base
    assert joined.count("/") == base.count("/") + 3


@pytest.mark.parametrize(
    ("content_type", "url", "ext"),
    [
        ("image/png", "https://x/a", ".png"),
        ("image/jpeg", "https://x/a.png", ".jpg"),
        ("IMAGE/WEBP; charset=binary", "https://x/a", ".webp"),
        ("image/gif", "https://x/a", ".gif"),
        ("video/mp4", "https://x/a", ".mp4"),
        ("video/webm", "https://x/a", ".webm"),
        ("video/quicktime", "https://x/a", ".mov"),
        ("application/octet-stream", "https://x/clip.WEBM?sig=x", ".webm"),
        ("application/octet-stream", "https://x/photo.jpeg", ".jpg"),
        ("application/octet-stream", "https://x/run.exe", ".bin"),
        ("application/octet-stream", "https://x/noext", ".bin"),
        ("text/html", "https://x/page", ".bin"),
    ],
)
def test_extension_for(content_type: str, url: str, ext: str) -> None:
    assert extension_for(content_type, url) == ext


def test_retry_after() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=lambda: 1445412470.0) == 10.0
