"""Just enough PromQL reading to find the metric names and label matchers an expression uses."""

from __future__ import annotations

import re
from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_BRACES = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_IDENTIFIER = re.compile(r"(?<![\w.])[A-Za-z_:][\w:]*")
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan"})
_SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r'([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
}


def metric_names(expr: str) -> set[str]:
    """The metric names selected by a PromQL expression (functions and keywords left out)."""
    text = _STRING.sub('""', expr)
    text = _LABEL_LISTS.sub(" ", text)
    text = _BRACES.sub(" ", text)
    text = _RANGES.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group()
        if text[match.end() :].lstrip().startswith("(") or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def matchers(expr: str) -> Iterator[tuple[str, str, str, str]]:
    """(metric, label, operator, value) for each label matcher on a named metric."""
    for selector in _SELECTOR.finditer(expr):
        for label, op, value in _MATCHER.findall(selector.group(2)):
            yield selector.group(1), label, op, value


def exposed_names(exposition: str) -> set[str]:
    """Every series name a /metrics page can produce, families without samples included."""
    names = set()
    for family in text_string_to_metric_families(exposition):
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names
