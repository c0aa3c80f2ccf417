"""Reading an OpenAPI 3.0 or 3.1 document for what it means, whatever its layout.

:class:`Document` answers what the drift check asks: does an operation exist (its path with or
without the ``/v1`` prefix, its path parameters named anyhow), which parameters it requires,
what its success answer, its error answer and the webhook body look like, and what a schema
says about one value (a :class:`~receiver.upstream.schema_shape.Shape`), following ``$ref``
(through the ``referencing`` library), ``allOf``, ``anyOf`` and ``oneOf``. So the same schema
under another component name, inlined, written with 3.0's ``nullable: true`` or 3.1's
``type: [x, "null"]``, reads the same. :class:`Walk` follows a path of members
(``data[].status``) through a value's schema.

Only what is asked for is read: a ``$ref`` cycle or a broken ``$ref`` elsewhere in the document
changes nothing. One on the way to something read raises :class:`SpecError`, one line naming
the reference, and so does nesting deeper than :data:`MAX_DEPTH`; nothing recurses without a
bound.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from receiver.errors import ReceiverError
from receiver.upstream.schema_shape import ANYTHING, Node, Shape, both, either, own_shape

#: How deep schemas may nest (through references and combinations) on the way to a field.
MAX_DEPTH = 64
_DOCUMENT_URI = "urn:upstream:openapi.json"
_PATH_PARAMETER = re.compile(r"\{[^}]*\}")
_SUCCESS = re.compile(r"2(\d\d|XX)", re.IGNORECASE)
_FAILURE = re.compile(r"[45](\d\d|XX)|default", re.IGNORECASE)
_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


class SpecError(ReceiverError):
    """The upstream's OpenAPI document cannot be used."""


@dataclass(frozen=True)
class OperationView:
    """One operation of the document."""

    node: Node
    parameters: Mapping[str, Node]  # "query:limit", "header:service-api-version"
    required: frozenset[str]

    @property
    def deprecated(self) -> bool:
        return self.node.contents.get("deprecated") is True


class Document:
    """An OpenAPI 3.0 or 3.1 document (see the module docstring)."""

    def __init__(self, raw: Any) -> None:
        if not isinstance(raw, dict):
            raise SpecError("the document is not a JSON object, so not an OpenAPI document")
        version = raw.get("openapi")
        if not isinstance(version, str) or not re.match(r"3\.[01]\.", version):
            found = f"openapi {version!r}" if "openapi" in raw else "no openapi member"
            if "swagger" in raw:
                found = f"swagger {raw['swagger']!r}"
            raise SpecError(f"not an OpenAPI 3.0 or 3.1 document ({_clip(found)})")
        paths = raw.get("paths", {})
        if not isinstance(paths, dict):
            raise SpecError("the document's paths is not an object")
        self.raw = raw
        self.openapi = version
        info = raw.get("info")
        revision = info.get("version") if isinstance(info, dict) else None
        #: ``info.version``: the revision of the upstream this document describes.
        self.revision = _clip(str(revision)) if revision is not None else "unknown"
        registry: Registry[Any] = Registry().with_resource(
            _DOCUMENT_URI, DRAFT202012.create_resource(raw)
        )
        self.root = Node(raw, registry.resolver(base_uri=_DOCUMENT_URI))
        self._routes: dict[str, str] = {}
        for path in paths:
            key = route_key(str(path))
            # "/v1/jobs/{id}" wins over "/jobs/{id}" when a document has both.
            if key not in self._routes or str(path).startswith("/v1/"):
                self._routes[key] = str(path)

    # --- references ---------------------------------------------------------------------

    def follow(self, node: Node, depth: int = 0) -> Node:
        """``node`` with a chain of bare ``$ref``s followed (a ``$ref`` beside other members is
        left for :meth:`shape`)."""
        seen: list[str] = []
        while isinstance(node.contents, dict) and set(node.contents) == {"$ref"}:
            ref = str(node.contents["$ref"])
            if ref in seen:
                raise SpecError(f"$ref cycle: {' -> '.join([*seen, ref])}")
            if len(seen) + depth > MAX_DEPTH:
                raise SpecError(f"schemas nested deeper than {MAX_DEPTH} levels (through $ref)")
            seen.append(ref)
            node = self._lookup(node, ref)
        return node

    def _lookup(self, node: Node, ref: str) -> Node:
        try:
            resolved = node.resolver.lookup(ref)
        except (Unresolvable, LookupError, TypeError, ValueError):  # through a value, a bad index
            raise SpecError(f"$ref {_clip(ref)!r} points to nothing in the document") from None
        return Node(resolved.contents, resolved.resolver)

    def member(self, node: Node, *names: str) -> Node | None:
        """``node[name][...]``, each step's ``$ref`` followed; None where one is missing."""
        for name in names:
            node = self.follow(node)
            if not isinstance(node.contents, dict) or name not in node.contents:
                return None
            node = Node(node.contents[name], node.resolver)
        return self.follow(node)

    # --- operations -----------------------------------------------------------------------

    def operation(self, method: str, route: str) -> OperationView | None:
        """The operation for ``method`` on ``route`` (as the client names it: ``/jobs/{id}``)."""
        path = self._routes.get(route_key(route))
        if path is None:
            return None
        item = self.member(self.root, "paths", path)
        op = self.member(item, method.lower()) if item is not None else None
        if item is None or op is None or not isinstance(op.contents, dict):
            return None
        parameters: dict[str, Node] = {}
        for source in (item, op):
            listed = self.member(source, "parameters")
            for entry in _entries(listed):
                param = self.follow(entry)
                if isinstance(param.contents, dict) and "name" in param.contents:
                    parameters[_parameter_key(param.contents)] = param
        required = {
            key
            for key, param in parameters.items()
            if param.contents.get("required") is True and not key.startswith("path:")
        }
        required |= {f"body:{name}" for name in self.shape(self.request_body(op)).required}
        return OperationView(op, parameters, frozenset(required))

    def request_body(self, op: Node) -> Node | None:
        """The schema of an operation's JSON request body, if it has one."""
        body = self.member(op, "requestBody")
        return _json_schema(self, body) if body is not None else None

    def success(self, op: OperationView) -> Node | None:
        """The schema of the operation's success answer (its first 2xx with a JSON body)."""
        for status, answer in _responses(self, op.node):
            if _SUCCESS.fullmatch(status):
                return _json_schema(self, answer)
        return None

    def failures(self, op: OperationView) -> Iterator[Node]:
        """The schemas of the operation's error answers (4xx, 5xx, default)."""
        for status, answer in _responses(self, op.node):
            if _FAILURE.fullmatch(status) and (schema := _json_schema(self, answer)):
                yield schema

    def webhook_bodies(self, operations: list[OperationView]) -> Iterator[Node]:
        """The schemas of the webhook bodies: the document's ``webhooks`` (3.1), else the
        callbacks of the operations given (3.0)."""
        items = list(_entries(self.member(self.root, "webhooks"), values=True))
        for op in operations:
            for callback in _entries(self.member(op.node, "callbacks"), values=True):
                items += _entries(callback, values=True)
        for item in items:
            for method in _METHODS:
                found = self.member(item, method)
                if found is not None and (body := self.request_body(found)) is not None:
                    yield body

    def component_schemas(self) -> Iterator[Node]:
        """Every schema under ``components.schemas`` (for objects no operation names)."""
        yield from _entries(self.member(self.root, "components", "schemas"), values=True)

    # --- schemas --------------------------------------------------------------------------

    def shape(self, node: Node | None, depth: int = 0, inside: tuple[int, ...] = ()) -> Shape:
        """What the schema at ``node`` says about its value (see :class:`Shape`)."""
        if node is None:
            return ANYTHING
        if depth > MAX_DEPTH:
            raise SpecError(f"schemas nested deeper than {MAX_DEPTH} levels")
        node = self.follow(node, depth)
        schema = node.contents
        if schema is False:
            return Shape(types=frozenset(), nullable=False, enum=frozenset())
        if not isinstance(schema, dict):
            return ANYTHING
        if id(schema) in inside:
            raise SpecError("$ref cycle: a schema includes itself through allOf, anyOf or oneOf")
        inside = (*inside, id(schema))
        parts = [own_shape(node)]
        if "$ref" in schema:  # beside other members: both apply
            parts.append(self.shape(self._lookup(node, str(schema["$ref"])), depth + 1, inside))
        parts += [self.shape(n, depth + 1, inside) for n in _list(node, "allOf")]
        for keyword in ("anyOf", "oneOf"):
            branches = [self.shape(n, depth + 1, inside) for n in _list(node, keyword)]
            if branches:
                parts.append(either(branches))
        combined = both(parts)
        if schema.get("nullable") is True or schema.get("x-nullable") is True:
            # 3.0: read as its authors mean it, also beside allOf/$ref.
            combined = replace(combined, nullable=True)
        return combined

    def shape_of(self, nodes: tuple[Node, ...], depth: int = 0) -> Shape:
        """The shape every one of ``nodes`` allows (the parts of an ``allOf``)."""
        return both([self.shape(n, depth) for n in nodes]) if nodes else ANYTHING


@dataclass(frozen=True)
class View:
    """What a document says about one place in a value: its shape, and whether its parent
    requires it."""

    shape: Shape
    required: bool


class Walk:
    """The places of one value (an answer, a body) by path (``("data", "[]", "status")``),
    each step read once; None where the document has no such place (or allows nothing
    there)."""

    def __init__(self, doc: Document, root: Node | None) -> None:
        self.doc = doc
        self.cache: dict[tuple[str, ...], View | None] = {(): View(doc.shape(root), True)}

    def view(self, path: tuple[str, ...]) -> View | None:
        if path in self.cache:
            return self.cache[path]
        parent = self.view(path[:-1])
        found = None if parent is None else self._child(parent.shape, path[-1], len(path))
        self.cache[path] = found
        return found

    def _child(self, parent: Shape, step: str, depth: int) -> View | None:
        if step == "[]":
            view = View(self.doc.shape_of(parent.items, depth), True)
        elif step == "*":
            view = View(self.doc.shape_of(parent.extra or (), depth), True)
        elif step in parent.properties:
            view = View(self.doc.shape_of(parent.properties[step], depth), step in parent.required)
        else:
            return None
        if view.shape.types == frozenset() and not view.shape.nullable:
            return None  # nothing is allowed there: as good as gone
        return view


def route_key(path: str) -> str:
    """A path as compared: without the ``/v1`` prefix, parameters unnamed, no trailing ``/``."""
    if path == "/v1" or path.startswith("/v1/"):
        path = path[3:]
    return _PATH_PARAMETER.sub("{}", path).rstrip("/") or "/"


def _list(node: Node, keyword: str) -> list[Node]:
    found = node.contents.get(keyword)
    return [Node(n, node.resolver) for n in found] if isinstance(found, list) else []


def _entries(node: Node | None, *, values: bool = False) -> list[Node]:
    """The members of a list (or, with ``values``, the values of an object) at ``node``."""
    if node is None:
        return []
    contents = node.contents
    if values and isinstance(contents, dict):
        return [Node(v, node.resolver) for v in contents.values()]
    if not values and isinstance(contents, list):
        return [Node(v, node.resolver) for v in contents]
    return []


def _parameter_key(param: Mapping[str, Any]) -> str:
    where, name = str(param.get("in", "")), str(param["name"])
    return f"{where}:{name.lower() if where == 'header' else name}"


def _responses(doc: Document, op: Node) -> list[tuple[str, Node]]:
    """The operation's answers by status, explicit codes before ranges and ``default``."""
    responses = doc.member(op, "responses")
    if responses is None or not isinstance(responses.contents, dict):
        return []
    found = [(str(status), Node(a, responses.resolver)) for status, a in responses.contents.items()]
    return sorted(found, key=lambda pair: (not pair[0].isdigit(), pair[0]))


def _json_schema(doc: Document, answer: Node) -> Node | None:
    """The schema of the JSON body of an answer or request body (first JSON media type)."""
    content = doc.member(answer, "content")
    if content is None or not isinstance(content.contents, dict) or not content.contents:
        return None
    types = list(content.contents)
    chosen = next((t for t in types if "json" in t.lower()), types[0])
    return doc.member(content, chosen, "schema")


def _clip(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
