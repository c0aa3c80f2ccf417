"""The docs hold together: the configuration page is what the schema generates, every relative
link in README.md and docs/ leads somewhere, and the README stays a front door."""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from urllib.parse import unquote

from receiver.config.reference import PAGE, render_reference
from receiver.config.settings import schema
from receiver.config.sink_types import COMMON_KEYS, SINK_TYPES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README_MAX_LINES = 300

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
_HTML = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
_HTML_ANCHOR = re.compile(r"""<a\s[^>]*\b(?:id|name)\s*=\s*["']([^"']+)["']""")
_SCHEME = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def prose(text: str) -> str:
    """``text`` without fenced code blocks and code spans (links there are not links)."""
    return _CODE_SPAN.sub("code", _FENCE.sub("", text))


def links(text: str) -> list[str]:
    body = prose(text)
    return _LINK.findall(body) + _REFERENCE.findall(body) + _HTML.findall(body)


def anchors(text: str) -> set[str]:
    """The ids GitHub gives the headings of ``text`` (and explicit ``<a id>`` anchors)."""
    found: set[str] = set(_HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for heading in _HEADING.findall(_FENCE.sub("", text)):
        words = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", words.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    text = page.read_text()
    broken = []
    for target in links(text):
        if _SCHEME.match(target):
            continue  # a URL, not a file of this repository
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target} (no {os.path.relpath(resolved, ROOT)})")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
            broken.append(f"{target} (no heading #{anchor} in {resolved.name})")
    return broken


def test_the_configuration_page_is_what_the_schema_generates() -> None:
    committed = (ROOT / PAGE).read_text() if (ROOT / PAGE).exists() else ""
    generated = render_reference()
    if committed != generated:
        diff = difflib.unified_diff(
            committed.splitlines(),
            generated.splitlines(),
            f"{PAGE} (committed)",
            f"{PAGE} (generated)",
            lineterm="",
            n=1,
        )
        raise AssertionError(
            f"{PAGE} is out of date with the config schema (receiver/config/settings.py, "
            "receiver/config/sink_types.py): run `make docs` and commit the page.\n"
            + "\n".join(list(diff)[:40])
        )


def test_the_generated_page_lists_every_key_and_renders_the_same_twice() -> None:
    text = render_reference()
    assert text == render_reference()
    chunks = re.split(r"^#{2,3} ", text, flags=re.M)
    by_heading = {chunk.splitlines()[0]: chunk for chunk in chunks[1:]}
    for section in schema():
        title = f"`[[{section.name}]]`" if section.many else f"`[{section.name}]`"
        for k in section.keys.values():
            assert f"| `{k.name}` |" in by_heading[title], k.path
            if k.env:
                assert f"`{k.env}`" in by_heading[title], k.path
    for name in COMMON_KEYS:
        assert f"| `{name}` |" in by_heading["Keys of every sink"], name
    for sink_type, spec in SINK_TYPES.items():
        for name in spec.options:
            assert f"| `{name}` |" in by_heading[f"`{sink_type}`"], f"{sink_type}.{name}"


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    broken = {
        str(page.relative_to(ROOT)): found for page in pages() if (found := broken_links(page))
    }
    assert broken == {}, f"links to files or headings that do not exist: {broken}"


def test_the_link_checker_sees_links_and_headings_as_github_does(tmp_path: Path) -> None:
    text = (
        "# A `[title]` here\n## Title: more (yes)\n## Title: more (yes)\n"
        '[a](x.md) ![b](img.png "t") [c](https://e.org) `[d](not-a-link.md)`\n'
        "```sh\n[e](fenced.md)\n# not a heading\n```\n[f]: ref.md\n<img src='y.png'>\n"
    )
    assert links(text) == ["x.md", "img.png", "https://e.org", "ref.md", "y.png"]
    assert anchors(text) == {"a-title-here", "title-more-yes", "title-more-yes-1"}
    page = tmp_path / "page.md"
    page.write_text("# Top\n[ok](#top) [missing](#nowhere) [gone](gone.md)\n")
    assert broken_links(page) == [
        "#nowhere (no heading #nowhere in page.md)",
        f"gone.md (no {os.path.relpath(tmp_path / 'gone.md', ROOT)})",
    ]


def test_every_docs_page_is_in_the_index() -> None:
    index = DOCS / "README.md"
    listed = {target.partition("#")[0] for target in links(index.read_text())}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p != index and p.name not in listed]
    assert missing == [], f"docs/README.md (the index) does not link {missing}"


def test_the_readme_stays_a_front_door() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): it is the front door; "
        "put reference and operations text in a page under docs/ and link it"
    )
