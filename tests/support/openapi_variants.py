"""OpenAPI documents of the upstream for the drift tests, made from the shipped baseline.

Each function returns a new document (a dict), never touching the baseline's. The re-laid-out
ones say exactly what the baseline says in another layout; each change says one thing more or
less, in one place.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from importlib import resources
from typing import Any

Doc = dict[str, Any]


def baseline_doc() -> Doc:
    text = resources.files("receiver.upstream").joinpath("spec", "baseline.json").read_text()
    return json.loads(text)


def _walk(node: Any, visit: Callable[[dict[str, Any]], None]) -> None:
    if isinstance(node, dict):
        visit(node)
        for value in list(node.values()):
            _walk(value, visit)
    elif isinstance(node, list):
        for value in node:
            _walk(value, visit)


def _rename_components(doc: Doc, rename: Callable[[str], str]) -> None:
    components = doc["components"]
    mapping: dict[str, str] = {}
    for kind in ("schemas", "parameters", "responses"):
        renamed = {}
        for name, value in components[kind].items():
            renamed[rename(name)] = value
            mapping[f"#/components/{kind}/{name}"] = f"#/components/{kind}/{rename(name)}"
        components[kind] = renamed

    def fix(node: dict[str, Any]) -> None:
        if isinstance(node.get("$ref"), str) and node["$ref"] in mapping:
            node["$ref"] = mapping[node["$ref"]]

    _walk(doc, fix)


def _inline(doc: Doc, name: str) -> None:
    """Replace every ``$ref`` to the schema ``name`` by a copy of it, and drop the component."""
    ref = f"#/components/schemas/{name}"
    schema = doc["components"]["schemas"].pop(name)

    def fix(node: dict[str, Any]) -> None:
        if node.get("$ref") == ref:
            del node["$ref"]
            node.update(copy.deepcopy(schema))

    _walk(doc, fix)


def _without_v1(doc: Doc) -> None:
    renamed = {}
    for path, item in doc["paths"].items():
        path = path.removeprefix("/v1")
        renamed[path.replace("{id}", "{resource_id}")] = item

    def fix(node: dict[str, Any]) -> None:
        if node.get("in") == "path" and node.get("name") == "id":
            node["name"] = "resource_id"

    doc["paths"] = renamed
    _walk(doc, fix)


def relaid_out_30() -> Doc:
    """The baseline as an OpenAPI 3.0 document: other component names, some schemas inlined,
    no ``/v1`` prefix, other path parameter names, ``nullable: true`` instead of a null type,
    ``enum`` instead of ``const``, the webhook body as a callback of ``POST /webhooks``."""
    doc = baseline_doc()
    doc["openapi"] = "3.0.3"

    def to_30(node: dict[str, Any]) -> None:
        if isinstance(node.get("type"), list):  # marked nullable first (below)
            node["type"] = next(t for t in node["type"] if t != "null")
        if "const" in node:
            node["enum"] = [node.pop("const")]
        if isinstance(node.get("exclusiveMinimum"), int | float) and not isinstance(
            node.get("exclusiveMinimum"), bool
        ):
            node["minimum"] = node["exclusiveMinimum"]
            node["exclusiveMinimum"] = True

    def nullable(node: dict[str, Any]) -> None:
        if isinstance(node.get("type"), list) and "null" in node["type"]:
            node["nullable"] = True

    _walk(doc, nullable)
    _walk(doc, to_30)
    hooks = doc.pop("webhooks")
    doc["paths"]["/v1/webhooks"]["post"]["callbacks"] = {
        "jobEvent": {"{$request.body#/url}": hooks["job.completed"]}
    }
    _rename_components(doc, lambda name: f"Upstream{name}V2")
    _inline(doc, "UpstreamJobV2")
    _inline(doc, "UpstreamPaginationV2")
    _without_v1(doc)
    return doc


def relaid_out_31() -> Doc:
    """The baseline in another 3.1 layout: nullable fields as ``anyOf`` with a null branch,
    answers composed with ``allOf``, the envelope written once with ``$ref`` beside members,
    the webhook body renamed, ``/v1`` kept but path parameters renamed."""
    doc = baseline_doc()
    schemas = doc["components"]["schemas"]

    def any_of(node: dict[str, Any]) -> None:
        props = node.get("properties")
        if not isinstance(props, dict):
            return
        for name, prop in list(props.items()):
            if isinstance(prop.get("type"), list) and "null" in prop["type"]:
                kinds = [t for t in prop["type"] if t != "null"]
                rest = {k: v for k, v in prop.items() if k != "type"}
                props[name] = {"anyOf": [{"type": kinds[0], **rest}, {"type": "null"}]}

    _walk(schemas, any_of)
    schemas["Envelope"] = {"type": "object", "required": ["data"], "properties": {"meta": {}}}
    for name in ("JobAnswer", "AssetAnswer"):
        data = schemas[name]["properties"]["data"]
        schemas[name] = {
            "allOf": [
                {"$ref": "#/components/schemas/Envelope"},
                {"properties": {"data": {"allOf": [data], "description": "the resource"}}},
            ]
        }
    _rename_components(doc, lambda name: "MascotEvent" if name == "WebhookEvent" else name)
    paths = {}
    for path, item in doc["paths"].items():
        paths[path.replace("{id}", "{key}")] = item

    def fix(node: dict[str, Any]) -> None:
        if node.get("in") == "path" and node.get("name") == "id":
            node["name"] = "key"

    doc["paths"] = paths
    _walk(doc, fix)
    return doc


# --- one change each ---------------------------------------------------------------------------


def _schemas(doc: Doc) -> dict[str, Any]:
    return doc["components"]["schemas"]


def operation_removed() -> Doc:
    doc = baseline_doc()
    del doc["paths"]["/v1/assets/{id}"]
    return doc


def field_removed() -> Doc:
    doc = baseline_doc()
    del _schemas(doc)["Asset"]["properties"]["file_url"]
    _schemas(doc)["Asset"]["required"].remove("file_url")
    return doc


def field_retyped() -> Doc:
    doc = baseline_doc()
    _schemas(doc)["Webhook"]["properties"]["consecutive_failures"] = {"type": "string"}
    return doc


def field_newly_nullable() -> Doc:
    doc = baseline_doc()
    _schemas(doc)["Job"]["properties"]["type"]["type"] = ["string", "null"]
    return doc


def job_status_value_added() -> Doc:
    doc = baseline_doc()
    _schemas(doc)["Job"]["properties"]["status"]["enum"].append("cancelled")
    return doc


def required_query_parameter_added() -> Doc:
    doc = baseline_doc()
    params = doc["paths"]["/v1/jobs/{id}"]["get"]["parameters"]
    params.append({"name": "fields", "in": "query", "required": True, "schema": {"type": "string"}})
    return doc


def unread_parts_changed() -> Doc:
    """Changes only to what the receiver never reads."""
    doc = baseline_doc()
    job = _schemas(doc)["Job"]
    job["properties"]["cost_credits"] = {"type": "string"}
    job["properties"]["type"]["enum"].append("voice_generation")
    job["properties"]["priority"] = {"type": "integer"}
    del _schemas(doc)["Asset"]["properties"]["archived_at"]
    _schemas(doc)["Asset"]["properties"]["type"]["enum"].append("gif")
    doc["paths"]["/v1/canvas-templates"] = {
        "get": {"responses": {"200": {"description": "templates"}}}
    }
    doc["paths"]["/v1/assets/{id}"]["get"]["parameters"].append(
        {"name": "expand", "in": "query", "required": False, "schema": {"type": "string"}}
    )
    doc["paths"]["/v1/jobs/{id}"]["get"]["parameters"].append(
        {"name": "Service-API-Version", "in": "header", "required": True}
    )
    return doc


def deprecated() -> Doc:
    doc = baseline_doc()
    doc["paths"]["/v1/webhooks"]["get"]["deprecated"] = True
    _schemas(doc)["Job"]["properties"]["item_name"]["deprecated"] = True
    return doc


def new_revision() -> Doc:
    doc = baseline_doc()
    doc["info"]["version"] = "1.15.0"
    return doc


def ref_cycle() -> Doc:
    doc = baseline_doc()
    schemas = _schemas(doc)
    schemas["JobAlias"] = {"$ref": "#/components/schemas/Job"}
    schemas["Job"] = {"$ref": "#/components/schemas/JobAlias"}
    return doc


def not_openapi() -> Doc:
    return {"swagger": "2.0", "info": {"title": "an older API", "version": "1"}, "paths": {}}
