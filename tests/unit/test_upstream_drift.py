"""The drift check compares meaning on what the receiver reads: layout is no change, each change
that matters is found with its severity, and a document it cannot use is one clear line."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from receiver.observe.metrics import DRIFT_SEVERITIES
from receiver.upstream.drift import SEVERITIES, DriftReport, Finding, compare
from receiver.upstream.openapi import MAX_DEPTH, Document, SpecError
from receiver.upstream.spec_source import baseline, parse_document
from tests.support import openapi_variants as variants

Doc = dict[str, Any]


def findings(doc: Doc) -> list[tuple[str, str, str]]:
    return [(f.severity, f.where, f.change) for f in compare(baseline(), Document(doc))]


def changed(change: Callable[[Doc], None], start: Callable[[], Doc] = variants.baseline_doc) -> Doc:
    doc = start()
    change(doc)
    return doc


def schemas(doc: Doc) -> dict[str, Any]:
    return doc["components"]["schemas"]


def test_the_baseline_matches_itself() -> None:
    assert findings(variants.baseline_doc()) == []


@pytest.mark.parametrize("relaid_out", [variants.relaid_out_30, variants.relaid_out_31])
def test_the_same_api_in_another_layout_is_no_change(relaid_out: Callable[[], Doc]) -> None:
    assert findings(relaid_out()) == []


def test_the_other_layouts_really_are_other_layouts() -> None:
    doc = variants.relaid_out_30()
    text = json.dumps(doc)
    assert doc["openapi"] == "3.0.3" and '"nullable": true' in text and '"null"' not in text
    assert not any(path.startswith("/v1") for path in doc["paths"])
    assert "webhooks" not in doc and "callbacks" in json.dumps(doc["paths"]["/webhooks"])
    assert "UpstreamJobV2" not in text and "UpstreamAssetV2" in schemas(doc)
    doc = variants.relaid_out_31()
    text = json.dumps(doc)
    assert '"anyOf"' in text and '"allOf"' in text and "MascotEvent" in schemas(doc)
    assert "WebhookEvent" not in text and "/v1/jobs/{key}" in doc["paths"]


def test_a_change_in_the_other_layout_is_still_found() -> None:
    def drop(doc: Doc) -> None:
        asset = schemas(doc)["UpstreamAssetV2"]
        del asset["properties"]["cdn_url"]
        asset["required"].remove("cdn_url")
        job = schemas(doc)["UpstreamJobAnswerV2"]["properties"]["data"]  # Job, inlined
        job["properties"]["status"]["enum"].append("queued")

    found = findings(changed(drop, variants.relaid_out_30))
    assert (
        "breaking",
        "asset.cdn_url (GET /assets/{id})",
        "gone: no longer in the answer",
    ) in found
    assert (
        "breaking",
        "job.status (GET /jobs/{id})",
        "new value 'queued': the receiver acts on this field",
    ) in found


@pytest.mark.parametrize(
    ("variant", "where", "change"),
    [
        (variants.operation_removed, "GET /assets/{id}", "gone from the document"),
        (variants.field_removed, "asset.file_url (GET /assets/{id})", "gone"),
        (variants.field_removed, "asset.file_url (GET /collections/{id}/assets)", "gone"),
        (
            variants.field_retyped,
            "webhook.consecutive_failures (GET /webhooks)",
            "type was number, now string",
        ),
        (variants.field_newly_nullable, "job.type (GET /jobs/{id})", "may now be null"),
        (variants.job_status_value_added, "job.status (GET /jobs/{id})", "new value 'cancelled'"),
        (
            variants.required_query_parameter_added,
            "GET /jobs/{id}",
            "now requires the query parameter 'fields'",
        ),
    ],
)
def test_each_breaking_change_is_found(variant: Callable[[], Doc], where: str, change: str) -> None:
    found = findings(variant())
    assert [f for f in found if f[1] == where and change in f[2] and f[0] == "breaking"], found
    assert all(severity == "breaking" for severity, _where, _change in found), found


def test_changes_to_what_the_receiver_never_reads_are_no_change() -> None:
    assert findings(variants.unread_parts_changed()) == []


def test_deprecation_and_a_new_revision_are_notices() -> None:
    assert sorted(findings(variants.deprecated())) == [
        ("notice", "GET /webhooks", "marked deprecated"),
        ("notice", "job.item_name (GET /jobs/{id})", "marked deprecated"),
    ]
    [(severity, where, change)] = findings(variants.new_revision())
    assert (severity, where) == ("notice", "document") and "revision 1.15.0" in change


def test_a_new_revision_with_a_breaking_change_says_the_change_only() -> None:
    def both(doc: Doc) -> None:
        doc["info"]["version"] = "2.0.0"
        schemas(doc)["Job"]["properties"]["status"]["enum"].append("queued")

    assert [f[1] for f in findings(changed(both))] == ["job.status (GET /jobs/{id})"]


@pytest.mark.parametrize(
    ("change", "where", "expected"),
    [
        (
            lambda d: schemas(d)["Job"]["required"].remove("collection_id"),
            "job.collection_id (GET /jobs/{id})",
            ("breaking", "no longer required: it may be absent"),
        ),
        (
            lambda d: schemas(d)["Job"]["properties"]["status"]["enum"].remove("processing"),
            "job.status (GET /jobs/{id})",
            ("breaking", "no longer lists 'processing', which the receiver acts on"),
        ),
        (
            lambda d: schemas(d)["Job"]["properties"]["status"].pop("enum"),
            "job.status (GET /jobs/{id})",
            ("breaking", "no longer limited to completed, failed, pending, processing"),
        ),
        (
            lambda d: schemas(d)["Asset"]["properties"]["status"].update(enum=["pending", "ready"]),
            "asset.status (GET /assets/{id})",
            ("breaking", "no longer lists 'completed', which the receiver acts on"),
        ),
        (
            lambda d: schemas(d)["Error"]["properties"]["error"]["properties"].update(
                code={"type": "integer"}
            ),
            "error.code",
            ("breaking", "type was string, now integer"),
        ),
        (
            lambda d: schemas(d)["WebhookEvent"]["properties"].pop("asset_ids"),
            "webhook body.asset_ids",
            ("breaking", "gone: no longer in the answer"),
        ),
        (
            lambda d: (d.pop("webhooks"), schemas(d).pop("WebhookEvent")),
            "webhook body",
            ("notice", "not described in the document: not compared"),
        ),
        (
            lambda d: schemas(d).update(JobAnswer=schemas(d)["Job"]),
            "GET /jobs/{id} answer: data",
            ("breaking", "gone: no longer in the answer"),
        ),
        (
            lambda d: schemas(d)["WebhookCreated"]["required"].remove("secret"),
            "created webhook.secret (POST /webhooks)",
            ("breaking", "no longer required: it may be absent"),
        ),
        (
            lambda d: d["paths"]["/v1/webhooks"]["post"]["requestBody"]["content"][
                "application/json"
            ]["schema"]["required"].append("description"),
            "POST /webhooks",
            (
                "breaking",
                "now requires the request body member 'description', which it does not send",
            ),
        ),
        (
            lambda d: schemas(d)["Job"]["properties"]["urls"].update(additionalProperties=True),
            "job.urls.* (GET /jobs/{id})",
            ("breaking", "type was string, now not stated (anything)"),
        ),
    ],
)
def test_what_each_change_is_called(
    change: Callable[[Doc], None], where: str, expected: tuple[str, str]
) -> None:
    assert [(s, c) for s, w, c in findings(changed(change)) if w == where] == [expected]


@pytest.mark.parametrize(
    "change",
    [
        # an integer where a number was: every integer is a number
        lambda d: schemas(d)["Webhook"]["properties"]["consecutive_failures"].update(
            type="integer"
        ),
        # a status the receiver waits for listed where none was, "completed" among them
        lambda d: schemas(d)["Asset"]["properties"]["status"].update(
            enum=["pending", "completed", "failed"]
        ),
        # a value dropped from a field only passed along
        lambda d: schemas(d)["Job"]["properties"]["type"]["enum"].remove("logo"),
        # a field that was optional made required
        lambda d: schemas(d)["Job"]["required"].append("item_name"),
        # the webhook body only as a component (no webhooks, no callbacks), under another name
        lambda d: (d.pop("webhooks"), schemas(d).update(Event=schemas(d).pop("WebhookEvent"))),
        # a $ref cycle in a part nobody reads
        lambda d: schemas(d).update(
            Loop={"$ref": "#/components/schemas/Loop2"}, Loop2={"$ref": "#/components/schemas/Loop"}
        ),
    ],
)
def test_changes_that_cannot_hurt_the_receiver_are_no_change(change: Callable[[Doc], None]) -> None:
    assert findings(changed(change)) == []


def one_line(exc: SpecError) -> str:
    assert "\n" not in exc.message and len(exc.message) < 200, exc.message
    return exc.message


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        (variants.ref_cycle(), "$ref cycle: #/components/schemas/Job -> "),
        (
            changed(
                lambda d: schemas(d)["Job"].update(allOf=[{"$ref": "#/components/schemas/Job"}])
            ),
            "$ref cycle",
        ),
        (
            changed(lambda d: schemas(d).update(Asset={"$ref": "#/components/schemas/Nowhere"})),
            "$ref '#/components/schemas/Nowhere' points to nothing in the document",
        ),
    ],
)
def test_a_broken_reference_on_the_way_to_a_field_is_one_line(doc: Doc, says: str) -> None:
    with pytest.raises(SpecError) as raised:
        compare(baseline(), Document(doc))
    assert says in one_line(raised.value)


def test_nesting_deeper_than_the_bound_is_refused_without_recursing_on() -> None:
    def deep(doc: Doc) -> None:
        job = schemas(doc)["Job"]
        for _ in range(MAX_DEPTH * 3):
            job = {"allOf": [job]}
        schemas(doc)["Job"] = job

    with pytest.raises(SpecError) as raised:
        compare(baseline(), Document(changed(deep)))
    assert f"nested deeper than {MAX_DEPTH}" in one_line(raised.value)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"<html>maintenance</html>", "the document is not JSON"),
        (b"[1, 2]", "not a JSON object, so not an OpenAPI document"),
        (
            json.dumps(variants.not_openapi()).encode(),
            "not an OpenAPI 3.0 or 3.1 document (swagger",
        ),
        (b'{"openapi": "4.0.0", "paths": {}}', "(openapi '4.0.0')"),
        (b'{"openapi": "3.1.0", "paths": []}', "paths is not an object"),
        (b"[" * 5000 + b"]" * 5000, "the document is not JSON"),
    ],
)
def test_what_is_not_an_openapi_document_is_one_line(body: bytes, says: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_document(body)
    assert says in one_line(raised.value)


def test_a_document_without_any_path_loses_every_operation() -> None:
    doc = {"openapi": "3.1.0", "info": {"title": "t", "version": "9"}}
    found = findings(doc)
    assert {w for s, w, _ in found if s == "breaking"} >= {
        "GET /jobs/{id}",
        "DELETE /webhooks/{id}",
    }


def test_the_report_counts_both_severities_and_says_its_exit_code() -> None:
    ok = DriftReport("1.14.0", "2026-08-20", 1.0, "1.14.0")
    assert ok.counts() == {"breaking": 0, "notice": 0} and ok.exit_code == 0
    notice = DriftReport(
        "1.15.0", "2026-08-20", 1.0, "1.14.0", findings=[Finding("notice", "a", "b")]
    )
    assert notice.exit_code == 0 and notice.counts()["notice"] == 1
    breaking = DriftReport(
        "2", "2026-08-20", 1.0, "1.14.0", findings=[Finding("breaking", "a", "b")]
    )
    assert breaking.exit_code == 1 and breaking.breaking == breaking.findings
    failed = DriftReport(None, "2026-08-20", 1.0, "1.14.0", error="not reachable")
    assert failed.exit_code == 2
    assert json.loads(json.dumps(breaking.as_json()))["findings"] == [
        {"severity": "breaking", "where": "a", "change": "b"}
    ]
    assert SEVERITIES == DRIFT_SEVERITIES


def test_the_baseline_document_is_not_changed_by_reading_it() -> None:
    before = copy.deepcopy(baseline().raw)
    compare(baseline(), Document(variants.relaid_out_30()))
    assert baseline().raw == before


JUNK = [
    None,
    5,
    "x",
    [],
    {},
    [1, "a"],
    True,
    {"$ref": 5},
    {"$ref": "#/paths"},
    {"$ref": "http://example.invalid/other.json#/x"},
    {"type": [{"a": 1}, 7]},
    {"allOf": 3, "anyOf": [None, 1]},
    {"enum": [{"a": 1}, [1], None]},
    {"required": "id", "properties": [], "additionalProperties": 3, "items": [1]},
]


def _places(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = []
    children = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else []
    )
    for key, value in children:
        found.append((*path, key))
        found += _places(value, (*path, key))
    return found


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_damaged_document_is_compared_or_refused_in_one_line(data: st.DataObject) -> None:
    doc = data.draw(st.sampled_from([variants.baseline_doc, variants.relaid_out_30]))()
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.sampled_from(_places(doc)))
        parent = doc
        for key in where[:-1]:
            parent = parent[key]
        parent[where[-1]] = copy.deepcopy(data.draw(st.sampled_from(JUNK)))
    try:
        compare(baseline(), Document(doc))
    except SpecError as exc:
        one_line(exc)
