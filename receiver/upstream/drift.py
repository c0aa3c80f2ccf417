"""Comparing the upstream's OpenAPI document with the revision this release was built against.

:func:`compare` looks only at what the receiver reads (:mod:`receiver.upstream.reads`): the
operations it calls, the fields of the objects it uses and the parameters it must send. It
reads both documents for their meaning (:mod:`receiver.upstream.openapi`), so other component
names, inlined schemas, paths with or without ``/v1`` and 3.0's ``nullable`` against 3.1's
``type: [x, "null"]`` are no change.

**Breaking** (the receiver may now misread an answer or be refused):

- an operation it calls is gone;
- a field it reads is gone, retyped (a type it does not handle is allowed; an ``integer`` where
  a ``number`` was is not a change), newly nullable, or no longer required (so it may be absent);
- a value is added to a field it acts on (a job's ``status``, an asset's ``status``), the field
  is no longer limited to listed values, or a value it acts on is no longer listed;
- an operation it calls newly requires a parameter (or a request body member) it does not send.

**Notice**: ``deprecated`` on an operation, field or parameter it uses; a value it does not act
on dropped from a field's list; the webhook or error body not described at all (nothing to
compare); a revision other than the one it was built against, when nothing breaking changed.

The result is a :class:`DriftReport`: what ``receiver upstream check`` prints, what ``receiver
serve`` keeps as its latest look (``Runtime.upstream_drift``) and exports as metrics.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from receiver.upstream.openapi import Document, OperationView, SpecError, View, Walk
from receiver.upstream.reads import (
    ALWAYS_SENT,
    ERROR,
    OPERATIONS,
    WEBHOOK_BODY,
    Field,
    Operation,
    UpstreamObject,
    join_path,
    split_path,
)
from receiver.upstream.schema_shape import Node, Shape

Severity = Literal["breaking", "notice"]
SEVERITIES: tuple[Severity, ...] = ("breaking", "notice")
#: The members that tell a webhook body apart when a document names it nowhere else.
_WEBHOOK_BODY_MEMBERS = frozenset({"id", "object", "event", "job_id"})


@dataclass(frozen=True)
class Finding:
    """One difference that matters: how much, where (an operation, or ``object.field``), and
    what changed, in words."""

    severity: Severity
    where: str
    change: str

    def as_json(self) -> dict[str, str]:
        return {"severity": self.severity, "where": self.where, "change": self.change}


@dataclass(frozen=True)
class DriftReport:
    """One look at the upstream's OpenAPI document.

    ``revision`` is the document's ``info.version`` (None while none was ever read);
    ``api_version`` the pinned ``api.version``; ``checked_at`` the unix time of the look;
    ``error`` why the document could not be read this time (the findings are then those of
    the last document read); ``baseline`` the revision this release was built against.
    """

    revision: str | None
    api_version: str
    checked_at: float
    baseline: str
    error: str | None = None
    findings: list[Finding] = field(default_factory=list)

    @property
    def breaking(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "breaking"]

    @property
    def notices(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "notice"]

    def counts(self) -> dict[Severity, int]:
        """The number of findings of each severity (both always present)."""
        return {s: sum(1 for f in self.findings if f.severity == s) for s in SEVERITIES}

    @property
    def exit_code(self) -> int:
        """0: nothing that matters changed; 1: something breaking did; 2: not read."""
        return 2 if self.error else 1 if self.breaking else 0

    def as_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "baseline": self.baseline,
            "api_version": self.api_version,
            "checked_at": self.checked_at,
            "error": self.error,
            "findings": [f.as_json() for f in self.findings],
            "counts": self.counts(),
        }


class _Findings:
    def __init__(self) -> None:
        self.found: dict[tuple[str, str], Finding] = {}

    def add(self, severity: Severity, where: str, change: str) -> None:
        self.found.setdefault((where, change), Finding(severity, where, change))

    @property
    def any_breaking(self) -> bool:
        return any(f.severity == "breaking" for f in self.found.values())


@dataclass(frozen=True)
class _Target:
    """A path to compare inside an answer, how to name it, and its field (if declared)."""

    label: str
    field: Field | None = None


def compare(baseline: Document, current: Document) -> list[Finding]:
    """What changed between ``baseline`` and ``current`` that matters to the receiver."""
    out = _Findings()
    called: list[OperationView] = []
    for op in OPERATIONS:
        before = baseline.operation(op.method, op.route)
        after = current.operation(op.method, op.route)
        if before is None:
            continue
        if after is None:
            out.add("breaking", op.name, "gone from the document, and the receiver calls it")
            continue
        called.append(after)
        _compare_operation(op, before, after, out)
        targets: dict[tuple[str, ...], _Target] = {}
        for obj, locator in op.answers:
            targets.update(_targets(obj, split_path(locator), op.name))
        if targets:
            _compare_answer(
                (baseline, baseline.success(before)),
                (current, current.success(after)),
                targets,
                op.name,
                out,
            )
    base_ops = [o for op in OPERATIONS if (o := baseline.operation(op.method, op.route))]
    _compare_object(
        ERROR,
        "error",
        baseline,
        _error_bodies(baseline, base_ops),
        current,
        _error_bodies(current, called),
        out,
    )
    _compare_object(
        WEBHOOK_BODY,
        "",
        baseline,
        list(baseline.webhook_bodies(base_ops)),
        current,
        _webhook_bodies(current, called),
        out,
    )
    if not out.any_breaking and current.revision != baseline.revision:
        out.add(
            "notice",
            "document",
            f"revision {current.revision} (this release was built against {baseline.revision}):"
            " nothing breaking for what the receiver reads",
        )
    return list(out.found.values())


def _compare_operation(
    op: Operation, before: OperationView, after: OperationView, out: _Findings
) -> None:
    if after.deprecated and not before.deprecated:
        out.add("notice", op.name, "marked deprecated")
    for key in sorted(after.required - before.required - op.sends - ALWAYS_SENT):
        where, name = key.split(":", 1)
        what = "request body member" if where == "body" else f"{where} parameter"
        out.add("breaking", op.name, f"now requires the {what} {name!r}, which it does not send")
    for key in sorted(op.sends | ALWAYS_SENT):
        param, old = after.parameters.get(key), before.parameters.get(key)
        if (
            param is not None
            and param.contents.get("deprecated") is True
            and not (old is not None and old.contents.get("deprecated") is True)
        ):
            where, name = key.split(":", 1)
            out.add("notice", op.name, f"the {where} parameter {name!r} it sends is deprecated")


def _targets(
    obj: UpstreamObject, locator: tuple[str, ...], operation: str
) -> dict[tuple[str, ...], _Target]:
    suffix = f" ({operation})" if operation else ""
    found: dict[tuple[str, ...], _Target] = {}
    for f in obj.promised:
        steps = locator + f.steps
        for n in range(1, len(steps)):
            prefix = steps[:n]
            if n <= len(locator):
                whose = f"{operation} answer" if operation else f"{obj.name} body"
                found.setdefault(prefix, _Target(f"{whose}: {join_path(prefix)}"))
            else:
                rel = join_path(prefix[len(locator) :])
                found.setdefault(prefix, _Target(f"{obj.name}.{rel}{suffix}"))
        found[steps] = _Target(f"{obj.name}.{f.path}{suffix}", f)
    return found


def _compare_answer(
    before: tuple[Document, Node | None],
    after: tuple[Document, Node | None],
    targets: dict[tuple[str, ...], _Target],
    operation: str,
    out: _Findings,
) -> None:
    if after[1] is None and before[1] is not None:
        out.add("breaking", operation, "its answer is no longer described as JSON")
        return
    old = Walk(*before)
    new = Walk(*after)
    stopped: list[tuple[str, ...]] = []
    for path in sorted(targets, key=len):
        if any(path[: len(s)] == s for s in stopped):
            continue
        was, now = old.view(path), new.view(path)
        if was is None:
            continue
        if _compare_value(targets[path], was, now, out):
            stopped.append(path)


def _compare_value(target: _Target, was: View, now: View | None, out: _Findings) -> bool:
    """Add what changed at one place; True when nothing below it can be compared."""
    where = target.label
    if now is None:
        out.add("breaking", where, "gone: no longer in the answer")
        return True
    old, new = was.shape, now.shape
    if old.types is not None:
        if new.types is None:
            out.add("breaking", where, f"type was {_types(old)}, now not stated (anything)")
            return True
        added = {t for t in new.types if t not in old.types}
        added -= {"integer"} if "number" in old.types else set()
        if added:
            out.add("breaking", where, f"type was {_types(old)}, now {_types(new)}")
            return True
    if new.nullable and not old.nullable:
        out.add("breaking", where, "may now be null")
    if was.required and not now.required:
        out.add("breaking", where, "no longer required: it may be absent")
    if target.field is not None and target.field.acts_on:
        _compare_values(where, target.field.acts_on, old, new, out)
    if new.deprecated and not old.deprecated:
        out.add("notice", where, "marked deprecated")
    return False


def _compare_values(
    where: str, acts_on: frozenset[str], old: Shape, new: Shape, out: _Findings
) -> None:
    """The values of a field the receiver acts on."""
    if new.enum is None:
        if old.enum is not None:
            out.add("breaking", where, f"no longer limited to {_values(old.enum)}")
        return
    if old.enum is not None:
        for value in sorted(new.enum - old.enum, key=str):
            out.add("breaking", where, f"new value {value!r}: the receiver acts on this field")
    for value in sorted(acts_on - new.enum):
        out.add("breaking", where, f"no longer lists {value!r}, which the receiver acts on")
    for value in sorted((old.enum or frozenset()) - new.enum - acts_on, key=str):
        out.add("notice", where, f"no longer lists {value!r}")


def _compare_object(
    obj: UpstreamObject,
    locator: str,
    baseline: Document,
    before: list[Node],
    current: Document,
    after: list[Node],
    out: _Findings,
) -> None:
    """An object no operation's answer holds (the webhook body, the error body)."""
    if not before:
        return
    if not after:
        out.add("notice", obj.name, "not described in the document: not compared")
        return
    targets = _targets(obj, split_path(locator), "")
    for node in after:
        _compare_answer((baseline, before[0]), (current, node), targets, obj.name, out)


def _error_bodies(doc: Document, operations: Iterable[OperationView]) -> list[Node]:
    """The first error answer (of the operations given, else a component) with ``error``."""
    candidates = [n for op in operations for n in doc.failures(op)]
    for node in [*candidates, *doc.component_schemas()]:
        if "error" in _members(doc, node):
            return [node]
    return []


def _webhook_bodies(doc: Document, operations: list[OperationView]) -> list[Node]:
    """The webhook bodies (webhooks, callbacks), else a component that has their members."""
    found = list(doc.webhook_bodies(operations))
    if found:
        return found
    return [n for n in doc.component_schemas() if _members(doc, n) >= _WEBHOOK_BODY_MEMBERS][:1]


def _members(doc: Document, node: Node) -> set[str]:
    try:
        return set(doc.shape(node).properties)
    except SpecError:  # a broken schema nobody reads is not a reason to fail
        return set()


def _types(shape: Shape) -> str:
    names = sorted(shape.types or ())
    if shape.nullable:
        names.append("null")
    return " or ".join(names) or "nothing"


def _values(values: frozenset[Any]) -> str:
    return ", ".join(sorted(str(v) for v in values))
