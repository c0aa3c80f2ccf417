"""Checking each fetched job, asset and asset page on the fields the receiver reads.

The API client hands every job, asset and collection asset page it fetched to :func:`checked`
(or :func:`checked_page`), which returns it unchanged: nothing is dropped, delayed or refused
here. A field that breaks what this release was built for (a type, a null where none may be, a
value outside the listed ones, a required field missing) is counted in
``receiver_upstream_invalid_total{object,field}`` (once per fetched object and field) and logged
at warning level the first time that object's field breaks it in the process.

Objects are checked against the baseline (:mod:`receiver.upstream.spec_source`), the document
this release was built for, and only on the fields :mod:`receiver.upstream.reads` declares: a
value the receiver does not know is counted even when a newer revision of the upstream's
document allows it (the drift check says that the document changed; this counter says how many
answers it touched). The JSON Schema of each object is built from the baseline's meaning of
those fields (so 3.0 and 3.1 spellings make no difference) and compiled once into a function
(``fastjsonschema``): a valid object costs one call of a few microseconds; only one that breaks
it is read again by ``jsonschema``, which names every field it breaks.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import fastjsonschema
from jsonschema import Draft7Validator
from jsonschema.exceptions import ValidationError

from receiver.logs import get_logger
from receiver.observe.metrics import Metrics
from receiver.upstream.openapi import Document, View, Walk
from receiver.upstream.reads import (
    GET_ASSET,
    GET_JOB,
    LIST_COLLECTION_ASSETS,
    Operation,
    join_path,
    split_path,
)
from receiver.upstream.spec_source import baseline

log = get_logger("receiver.upstream")

T = TypeVar("T")
_DRAFT = "http://json-schema.org/draft-07/schema#"
#: The objects checked: the name counted, the operation that fetches it, where in its answer the
#: value handed to :func:`checked` is.
CHECKED: dict[str, tuple[Operation, str]] = {
    "job": (GET_JOB, "data"),
    "asset": (GET_ASSET, "data"),
    "asset page": (LIST_COLLECTION_ASSETS, ""),
}


@dataclass
class _Place:
    """One place of a checked value: what the baseline says there, and the places below."""

    view: View
    leaf: bool = False
    below: dict[str, _Place] = field(default_factory=dict)

    def schema(self) -> dict[str, Any]:
        shape = self.view.shape
        out: dict[str, Any] = {}
        if shape.types is not None:
            out["type"] = sorted(shape.types) + (["null"] if shape.nullable else [])
        if self.leaf and shape.enum is not None:
            out["enum"] = sorted(shape.enum, key=str) + ([None] if shape.nullable else [])
        names = {k: v for k, v in self.below.items() if k not in ("[]", "*")}
        if names:
            out["properties"] = {k: v.schema() for k, v in names.items()}
            required = sorted(k for k, v in names.items() if v.view.required)
            if required:
                out["required"] = required
        if "[]" in self.below:
            out["items"] = self.below["[]"].schema()
        if "*" in self.below:
            out["additionalProperties"] = self.below["*"].schema()
        return out

    def expected(self) -> str:
        """What the place must hold, in words (never the value found)."""
        shape = self.view.shape
        if self.leaf and shape.enum is not None:
            text = "one of " + ", ".join(sorted(str(v) for v in shape.enum))
        else:
            text = " or ".join(sorted(shape.types or {"anything"}))
        return f"{text} or null" if shape.nullable else text


class ObjectCheck:
    """The compiled check of one object kind (see the module docstring)."""

    def __init__(self, doc: Document, kind: str) -> None:
        operation, at = CHECKED[kind]
        found = doc.operation(operation.method, operation.route)
        walk = Walk(doc, doc.success(found) if found is not None else None)
        base = split_path(at)
        root_view = walk.view(base)
        if root_view is None:
            raise ValueError(f"the document describes no {kind} at {at!r}")
        self.kind = kind
        self.root = _Place(root_view)
        for obj, locator in operation.answers:
            for f in obj.promised:
                steps = split_path(locator) + f.steps
                if steps[: len(base)] == base:
                    self._add(walk, base, steps[len(base) :])
        self.schema = {"$schema": _DRAFT, **self.root.schema()}
        Draft7Validator.check_schema(self.schema)
        # Every answer takes the compiled function; only one that fails it takes the
        # validator that names every field it breaks.
        self._is_valid = fastjsonschema.compile(self.schema)
        self._validator = Draft7Validator(self.schema)

    def _add(self, walk: Walk, base: tuple[str, ...], steps: tuple[str, ...]) -> None:
        place = self.root
        for n, step in enumerate(steps, 1):
            if step not in place.below:
                view = walk.view(base + steps[:n])
                if view is None:
                    raise ValueError(f"the document describes no {self.kind} {join_path(steps)}")
                place.below[step] = _Place(view)
            place = place.below[step]
        place.leaf = True

    def problems(self, value: Any) -> dict[str, str]:
        """The fields of ``value`` that break the check, each with what it must hold."""
        try:
            self._is_valid(value)
        except fastjsonschema.JsonSchemaException:
            pass
        else:
            return {}
        found: dict[str, str] = {}
        for error in self._validator.iter_errors(value):
            for path in _error_paths(error):
                label, place = self._label(path)
                found.setdefault(
                    label, "present" if error.validator == "required" else place.expected()
                )
        return found

    def _label(self, path: list[Any]) -> tuple[str, _Place]:
        """A path inside a value as the field it is (``data[].status``, ``urls.*``)."""
        place, steps = self.root, []
        for key in path:
            step = "[]" if isinstance(key, int) else key if key in place.below else "*"
            if step not in place.below:
                break
            steps.append(step)
            place = place.below[step]
        return join_path(tuple(steps)) or "(whole)", place


def _error_paths(error: ValidationError) -> Iterator[list[Any]]:
    path = list(error.absolute_path)
    names = error.validator_value
    if error.validator == "required" and isinstance(error.instance, dict):
        for name in names if isinstance(names, list) else ():
            if name not in error.instance:
                yield [*path, name]
    else:
        yield path


@functools.cache
def baseline_checks() -> dict[str, ObjectCheck]:
    """The checks of every kind, compiled once from the baseline."""
    doc = baseline()
    return {kind: ObjectCheck(doc, kind) for kind in CHECKED}


# Which (object, field) were logged, per metrics registry (one receiver), else per process.
_LOGGED: weakref.WeakKeyDictionary[Metrics, set[tuple[str, str]]] = weakref.WeakKeyDictionary()
_LOGGED_WITHOUT_METRICS: set[tuple[str, str]] = set()


def checked(kind: str, value: T, metrics: Metrics | None) -> T:
    """``value`` (a fetched ``job`` or ``asset``) unchanged, its breaks counted and logged."""
    problems = baseline_checks()[kind].problems(value)
    if problems:
        _report(kind, problems, metrics)
    return value


def checked_page(
    page: list[dict[str, Any]], pagination: dict[str, Any], metrics: Metrics | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A collection asset page (its entries and ``meta.pagination``) unchanged, checked."""
    envelope: dict[str, Any] = {"data": page}
    if pagination:
        envelope["meta"] = {"pagination": pagination}
    checked("asset page", envelope, metrics)
    return page, pagination


def _report(kind: str, problems: dict[str, str], metrics: Metrics | None) -> None:
    logged = _LOGGED.setdefault(metrics, set()) if metrics is not None else _LOGGED_WITHOUT_METRICS
    for name, expected in problems.items():
        if metrics is not None:
            metrics.upstream_invalid.labels(kind, name).inc()
        if (kind, name) not in logged:
            logged.add((kind, name))
            log.warning(
                "an upstream answer breaks the specification on a field the receiver reads; "
                "it is used all the same (see receiver_upstream_invalid_total)",
                object=kind,
                field=name,
                expected=expected,
            )
