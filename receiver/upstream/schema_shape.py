"""What one schema of an OpenAPI document says about a value, whatever its layout.

A :class:`Shape` is the meaning of a schema for the drift check: the JSON types a value may
have, whether it may be null, the values it may take, whether it is deprecated, and its members
(still unread :class:`Node` s, so that a recursive schema is read only as deep as asked).
:func:`both` combines what ``allOf`` parts say, :func:`either` what ``anyOf``/``oneOf`` branches
say; :func:`own_shape` reads a schema's own keywords: ``type`` as a name or a list (3.1's
``[x, "null"]``), ``nullable`` (3.0), ``enum`` and ``const``, and the type other keywords imply
when ``type`` is left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The types of JSON Schema (``integer`` is a ``number`` without a fraction).
JSON_TYPES = frozenset({"null", "boolean", "object", "array", "number", "integer", "string"})


@dataclass(frozen=True)
class Node:
    """A part of the document, with the resolver for the ``$ref`` inside it."""

    contents: Any
    resolver: Any  # a referencing Resolver: looks a $ref up from where it stands


@dataclass(frozen=True)
class Shape:
    """What a schema says about a value, whatever its layout.

    ``types`` are the JSON types allowed besides null (None: any); ``enum`` the values allowed
    besides null (None: any); ``extra`` the schemas of members not named in ``properties``
    (None: anything).
    """

    types: frozenset[str] | None = None
    nullable: bool = True
    enum: frozenset[Any] | None = None
    deprecated: bool = False
    properties: Mapping[str, tuple[Node, ...]] = field(default_factory=dict)
    required: frozenset[str] = frozenset()
    items: tuple[Node, ...] = ()
    extra: tuple[Node, ...] | None = None

    @property
    def admits_values(self) -> bool:
        """Whether a value other than null is allowed."""
        return self.types is None or bool(self.types)


ANYTHING = Shape()


def both(shapes: list[Shape]) -> Shape:
    """What all of ``shapes`` allow together (``allOf``)."""
    types: frozenset[str] | None = None
    enum: frozenset[Any] | None = None
    properties: dict[str, tuple[Node, ...]] = {}
    extra: tuple[Node, ...] | None = None
    for s in shapes:
        types = s.types if types is None else (types if s.types is None else _meet(types, s.types))
        enum = s.enum if enum is None else (enum if s.enum is None else enum & s.enum)
        for name, nodes in s.properties.items():
            properties[name] = properties.get(name, ()) + nodes
        if s.extra is not None:
            extra = (extra or ()) + s.extra
    return Shape(
        types=types,
        nullable=all(s.nullable for s in shapes),
        enum=enum,
        deprecated=any(s.deprecated for s in shapes),
        properties=properties,
        required=frozenset().union(*(s.required for s in shapes)),
        items=tuple(n for s in shapes for n in s.items),
        extra=extra,
    )


def either(shapes: list[Shape]) -> Shape:
    """What any of ``shapes`` allows (``anyOf``, ``oneOf``): a branch that allows only null
    makes the value nullable and adds nothing else."""
    valued = [s for s in shapes if s.admits_values] or shapes
    types: frozenset[str] | None = frozenset()
    enum: frozenset[Any] | None = frozenset()
    properties: dict[str, tuple[Node, ...]] = {}
    for s in valued:
        types = None if types is None or s.types is None else types | s.types
        enum = None if enum is None or s.enum is None else enum | s.enum
        for name, nodes in s.properties.items():
            properties[name] = properties.get(name, ()) + nodes
    extras = [s.extra for s in valued]
    return Shape(
        types=types,
        nullable=any(s.nullable for s in shapes),
        enum=enum,
        deprecated=all(s.deprecated for s in valued),
        properties=properties,
        required=frozenset.intersection(*(s.required for s in valued)),
        items=tuple(n for s in valued for n in s.items),
        extra=None if any(e is None for e in extras) else tuple(n for e in extras for n in e or ()),
    )


def value_key(value: Any) -> Any:
    """An enum value as a set member (objects and lists by their JSON)."""
    if isinstance(value, str | int | float | bool):
        return value
    return json.dumps(value, sort_keys=True)


def own_shape(node: Node) -> Shape:
    """What a schema's own members say (not its ``$ref`` or combinations)."""
    schema: dict[str, Any] = node.contents
    declared = schema.get("type")
    listed = [declared] if isinstance(declared, str) else declared
    known = (
        [t for t in listed if isinstance(t, str) and t in JSON_TYPES]
        if isinstance(listed, list)
        else []
    )
    types = frozenset(known) if known else None  # a type no JSON value has says nothing
    values: list[Any] | None = None
    if "const" in schema:
        values = [schema["const"]]
    elif isinstance(schema.get("enum"), list):
        values = list(schema["enum"])
    if types is None:
        types = _implied_types(schema, values)
    nullable = types is None or "null" in types or (values is not None and None in values)
    enum = None if values is None else frozenset(value_key(v) for v in values if v is not None)
    properties = schema.get("properties")
    required = schema.get("required")
    extra = schema.get("additionalProperties", True)
    return Shape(
        types=None if types is None else types - {"null"},
        nullable=nullable,
        enum=enum,
        deprecated=schema.get("deprecated") is True,
        properties={
            str(name): (Node(sub, node.resolver),)
            for name, sub in (properties.items() if isinstance(properties, dict) else ())
        },
        required=frozenset(str(r) for r in required) if isinstance(required, list) else frozenset(),
        items=(Node(schema["items"], node.resolver),) if "items" in schema else (),
        extra=None if extra is True else (Node(extra, node.resolver),),
    )


def _implied_types(schema: Mapping[str, Any], values: list[Any] | None) -> frozenset[str] | None:
    """The type a schema without ``type`` implies by its other members, if any."""
    if any(k in schema for k in ("properties", "required", "additionalProperties")):
        return frozenset({"object"})
    if "items" in schema:
        return frozenset({"array"})
    if values:
        return frozenset(_json_type(v) for v in values)
    return None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _meet(a: frozenset[str], b: frozenset[str]) -> frozenset[str]:
    """The types both allow; an integer is a number."""
    met = set(a & b)
    if ("integer" in a and "number" in b) or ("integer" in b and "number" in a):
        met.add("integer")
    return frozenset(met)
