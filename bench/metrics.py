"""Reading a receiver's /metrics page (the Prometheus text format): a metric summed over its
labels, or split by one label."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def sums(text: str, *names: str) -> dict[str, float]:
    """Each of ``names`` (a sample's full name, e.g. ``..._total``) summed over its labels; a
    name the page does not have is left out."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                found[sample.name] = found.get(sample.name, 0.0) + sample.value
    return found


def by_label(text: str, name: str, label: str) -> dict[str, float]:
    """The samples of ``name`` by the value of their ``label`` (empty when the page has none)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                key = sample.labels.get(label, "")
                found[key] = found.get(key, 0.0) + sample.value
    return found


def scrape(port: int, timeout: float = 5.0) -> str | None:
    """The /metrics page of the ops listener on local ``port``; None when it does not answer."""
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.read().decode())
    except OSError:
        return None
