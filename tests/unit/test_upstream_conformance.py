"""Fetched jobs, assets and asset pages are checked on the fields the receiver reads: counted per
field, logged once, never changed or refused."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from structlog.testing import capture_logs

from receiver.observe.metrics import Metrics
from receiver.upstream.conformance import ObjectCheck, baseline_checks, checked, checked_page
from receiver.upstream.openapi import Document
from tests.support import openapi_variants as variants

SIGNED = "https://cdn.example/a.png?sig=SECRET-SIGNATURE"
ASSET_TYPES = variants.baseline_doc()["components"]["schemas"]["Asset"]["properties"]["type"][
    "enum"
]


def job(**more: Any) -> dict[str, Any]:
    return {
        "id": "j1",
        "status": "completed",
        "type": "logo",
        "collection_id": None,
        "cost_credits": 5,
        "created_at": "2026-08-20T12:00:00Z",
        "updated_at": "2026-08-20T12:00:00Z",
        "urls": {"logo": SIGNED},
        **more,
    }


def asset(**more: Any) -> dict[str, Any]:
    return {
        "id": "a1",
        "type": "image",
        "status": "completed",
        "item_id": None,
        "file_url": SIGNED,
        "cdn_url": None,
        "created_at": "2026-08-20T12:00:00Z",
        "metadata": {"job_id": "j1", "anything": [1, 2]},
        **more,
    }


def invalid(metrics: Metrics, kind: str, field: str) -> float | None:
    return metrics.registry.get_sample_value(
        "receiver_upstream_invalid_total", {"object": kind, "field": field}
    )


def test_what_the_spec_promises_passes_unchanged() -> None:
    metrics = Metrics()
    value = job(item_name=None, error="boom", item_id="i1", extra_member={"x": 1})
    before = copy.deepcopy(value)
    assert checked("job", value, metrics) is value and value == before
    page = [asset(), asset(id="a2", is_archived=True, collection_id="c1")]
    pagination = {"total": 2, "limit": 100, "offset": 0, "has_more": False}
    assert checked_page(page, pagination, metrics) == (page, pagination)
    assert checked_page(page, {}, metrics) == (page, {})  # no meta: the spec's `meta?`
    assert "receiver_upstream_invalid_total{" not in metrics.render().decode()


@pytest.mark.parametrize(
    ("kind", "value", "fields"),
    [
        (
            "job",
            job(status="cancelled"),
            {"status": "one of completed, failed, pending, processing"},
        ),
        (
            "job",
            job(urls={"logo": 7}, item_name=3),
            {"urls.*": "string", "item_name": "string or null"},
        ),
        ("job", {k: v for k, v in job().items() if k != "updated_at"}, {"updated_at": "present"}),
        ("asset", asset(file_url=12345), {"file_url": "string or null"}),
        (
            "asset",
            asset(is_archived="yes", metadata=[]),
            {"is_archived": "boolean", "metadata": "object or null"},
        ),
        ("asset", asset(type="gif"), {"type": "one of " + ", ".join(sorted(ASSET_TYPES))}),
    ],
)
def test_each_broken_field_is_named_with_what_it_must_hold(
    kind: str, value: dict[str, Any], fields: dict[str, str]
) -> None:
    assert baseline_checks()[kind].problems(value) == fields


def test_a_page_names_the_field_of_its_entries_and_of_its_pagination() -> None:
    envelope = {
        "data": [asset(), asset(status=None), {"id": "a3"}],
        "meta": {"pagination": {"total": 3, "limit": "100", "offset": 0, "has_more": False}},
    }
    problems = baseline_checks()["asset page"].problems(envelope)
    assert problems["data[].status"] == "string"
    assert problems["data[].file_url"] == "present"
    assert problems["meta.pagination.limit"] == "integer"
    assert "data[].id" not in problems


def test_breaks_are_counted_each_fetch_and_logged_once_without_the_value() -> None:
    metrics = Metrics()
    with capture_logs() as logs:
        for _ in range(3):
            checked("asset", asset(file_url=12345, status=None), metrics)
    assert invalid(metrics, "asset", "file_url") == 3
    assert invalid(metrics, "asset", "status") == 3
    warned = sorted((e["object"], e["field"], e["expected"]) for e in logs)
    assert warned == [("asset", "file_url", "string or null"), ("asset", "status", "string")]
    assert "12345" not in str(logs) and "SECRET" not in str(logs)
    other = Metrics()  # another receiver in the same process says it again, once
    with capture_logs() as logs:
        checked("asset", asset(status=None), other)
    assert [e["field"] for e in logs] == ["status"] and invalid(other, "asset", "status") == 1


def test_the_checks_mean_the_same_whatever_the_layout_of_the_document() -> None:
    for layout in (variants.relaid_out_30, variants.relaid_out_31):
        document = Document(layout())
        for kind, check in baseline_checks().items():
            assert ObjectCheck(document, kind).schema == check.schema, (layout.__name__, kind)
