"""The declared read set (receiver/upstream/reads.py) is the receiver's own use of the upstream.

The source is read (``ast``), not run: every request the API client sends is a declared
operation; every field the modules that handle an upstream object read from it with a literal
name (``obj.get("name")``, ``obj["name"]``, ``"name" in obj``) is declared on that object; every
declared field is read somewhere; the declared fields stand in the shipped baseline with the
types the receiver copes with.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import receiver
from receiver.config.settings import ApiSettings
from receiver.delivery import enrich
from receiver.pull import events as pull_events
from receiver.pull import reconcile
from receiver.upstream import client
from receiver.upstream.openapi import Walk
from receiver.upstream.reads import (
    ASSET,
    ASSET_PAGE,
    CREATED_WEBHOOK,
    ERROR,
    JOB,
    JOB_STATUSES,
    OBJECTS,
    OPERATIONS,
    WEBHOOK,
    WEBHOOK_BODY,
    WEBHOOK_LIST,
    UpstreamObject,
    join_path,
    split_path,
)
from receiver.upstream.spec_source import baseline

ROOT = Path(receiver.__file__).parent

Binding = tuple[UpstreamObject, str]  # the object a name holds, and where inside it
#: The modules that handle upstream objects, and what their names hold.
HOLDERS: dict[str, dict[str, Binding]] = {
    "intake/endpoint.py": {"event": (WEBHOOK_BODY, "")},
    "delivery/enrich.py": {
        "payload": (WEBHOOK_BODY, ""),
        "job": (JOB, ""),
        "asset": (ASSET, ""),
        "a": (ASSET, ""),
    },
    "events.py": {"self.job": (JOB, ""), "self.payload": (WEBHOOK_BODY, "")},
    "outbound/template.py": {"job": (JOB, ""), "enriched.job": (JOB, ""), "asset": (ASSET, "")},
    "store/asset_ledger.py": {"job": (JOB, ""), "asset": (ASSET, "")},
    "pull/poller.py": {"job": (JOB, "")},
    "pull/reconcile.py": {
        "asset": (ASSET, ""),
        "metadata": (ASSET, "metadata"),
        "pagination": (ASSET_PAGE, "meta.pagination"),
    },
    "upstream/client.py": {
        "hook": (WEBHOOK, ""),
        "error": (ERROR, ""),
        "pagination": (WEBHOOK_LIST, "meta.pagination"),
    },
    "upstream/watchdog.py": {"hook": (WEBHOOK, "")},
    "upstream/subscriptions.py": {"created": (CREATED_WEBHOOK, ""), "h": (WEBHOOK, "")},
    "web/pages.py": {"hook": (WEBHOOK, "")},
    "cli/webhooks.py": {"hook": (WEBHOOK, "")},
}
#: In every other module (but the simulator, which makes these objects), these names hold them.
EVERYWHERE: dict[str, Binding] = {
    "job": (JOB, ""),
    "asset": (ASSET, ""),
    "hook": (WEBHOOK, ""),
    "enriched.job": (JOB, ""),
    "snapshot.job": (JOB, ""),
}
#: Declared fields read without a literal name (iterated, or the envelope's ``data``).
READ_OTHERWISE = {
    ("job", "urls.*"),
    ("webhook body", "asset_ids.*"),
    ("asset page", "data"),
    ("webhook list", "data"),
    ("webhook", "events[]"),
    ("created webhook", "events[]"),
    # `receiver webhooks register` reads them under the name `hook`, which in `webhooks list`
    # holds a listed subscription (read as a webhook above).
    ("created webhook", "url"),
    ("created webhook", "events"),
}


def dotted(node: ast.expr) -> str | None:
    """``job`` or ``self.job`` for a name or an attribute chain, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (inner := dotted(node.value)):
        return f"{inner}.{node.attr}"
    return None


def literal_reads(tree: ast.AST) -> Iterator[tuple[str, str, int]]:
    """(holder, field name, line) for each read of a literal member."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (holder := dotted(node.func.value))
        ):
            yield holder, node.args[0].value, node.lineno
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
            and (holder := dotted(node.value))
        ):
            yield holder, node.slice.value, node.lineno
        elif (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], ast.In | ast.NotIn)
            and isinstance(node.left, ast.Constant)
            and isinstance(node.left.value, str)
            and (holder := dotted(node.comparators[0]))
        ):
            yield holder, node.left.value, node.lineno


def reads_of(source: str, names: dict[str, Binding]) -> Iterator[tuple[str, str, int]]:
    """(object name, field path, line) of every read of an upstream object in ``source``."""
    for holder, name, line in literal_reads(ast.parse(source)):
        if holder in names:
            obj, inside = names[holder]
            yield obj.name, f"{inside}.{name}" if inside else name, line


def undeclared(reads: Iterator[tuple[str, str, int]], where: str) -> list[str]:
    by_name = {o.name: o for o in OBJECTS}
    out = []
    for obj, path, line in reads:
        declared = [f.path for f in by_name[obj].fields]
        if not any(p == path or p.startswith(f"{path}.") for p in declared):
            out.append(f"{where}:{line}: {obj}.{path}")
    return out


def every_read() -> tuple[set[tuple[str, str]], list[str]]:
    seen: set[tuple[str, str]] = set()
    missing: list[str] = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("simulator/"):
            continue
        names = HOLDERS.get(relative, EVERYWHERE)
        reads = list(reads_of(path.read_text(), names))
        seen.update((obj, field) for obj, field, _line in reads)
        missing += undeclared(iter(reads), relative)
    return seen, missing


def test_every_field_the_receiver_reads_is_declared_on_its_object() -> None:
    for relative in HOLDERS:
        assert (ROOT / relative).is_file(), f"{relative} is gone: update HOLDERS"
    seen, missing = every_read()
    assert missing == [], "fields read but not declared in receiver/upstream/reads.py"
    assert ("job", "status") in seen and ("asset", "file_url") in seen


def test_every_declared_field_is_read_somewhere() -> None:
    seen, _missing = every_read()
    declared = {(o.name, f.path) for o in OBJECTS for f in o.fields}
    covered = {
        (obj, path)
        for obj, path in declared
        if any(s == (obj, path) or (s[0] == obj and s[1].startswith(f"{path}.")) for s in seen)
    }
    assert declared - covered - READ_OTHERWISE == set(), "declared but read nowhere"


def test_the_scan_finds_a_new_field_read_without_a_declaration() -> None:
    source = (
        "def f(job, asset, hook):\n"
        "    job.get('status'); asset['file_url']; 'events' in hook\n"
        "    job.get('priority'); asset['width']; 'secret_hint' in hook\n"
    )
    found = undeclared(reads_of(source, EVERYWHERE), "planted.py")
    assert found == [
        "planted.py:3: job.priority",
        "planted.py:3: asset.width",
        "planted.py:3: webhook.secret_hint",
    ]


def _constant(node: ast.expr) -> bool:
    """A module constant such as ``JOB_ENDPOINT`` (``pages`` passes its ``endpoint`` on)."""
    return isinstance(node, ast.Name) and node.id.isupper()


def client_requests() -> set[tuple[str, str]]:
    """(method, route) of every request the API client's source sends."""
    tree = ast.parse(Path(client.__file__).read_text())
    found = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        args = node.args
        if node.func.attr == "_request" and len(args) >= 2 and _constant(args[1]):
            assert isinstance(args[0], ast.Constant), ast.unparse(node)
            found.add((args[0].value, getattr(client, args[1].id)))
        elif node.func.attr == "pages" and args and _constant(args[0]):
            found.add(("GET", getattr(client, args[0].id)))
    return found


def test_the_client_sends_exactly_the_declared_operations() -> None:
    assert client_requests() == {(op.method, op.route) for op in OPERATIONS}


def test_the_values_acted_on_are_the_ones_the_code_acts_on() -> None:
    assert JOB.field("status").acts_on == JOB_STATUSES
    assert enrich.UNFINISHED_JOB_STATES | set(pull_events.OUTCOME_BY_STATUS) == JOB_STATUSES
    assert ASSET.field("status").acts_on == {enrich.ASSET_READY} == {reconcile.ASSET_READY}


def _places() -> Iterator[tuple[str, Walk, tuple[str, ...], UpstreamObject]]:
    doc = baseline()
    for op in OPERATIONS:
        view = doc.operation(op.method, op.route)
        assert view is not None, op.name
        walk = Walk(doc, doc.success(view))
        for obj, locator in op.answers:
            yield op.name, walk, split_path(locator), obj
    first_error = next(doc.failures(doc.operation("GET", "/jobs/{id}")))  # type: ignore[arg-type]
    yield "error answers", Walk(doc, first_error), ("error",), ERROR
    body = next(doc.webhook_bodies([]))
    yield "webhooks", Walk(doc, body), (), WEBHOOK_BODY


def test_the_baseline_describes_every_declared_field_with_types_the_receiver_handles() -> None:
    seen_objects = set()
    for operation, walk, locator, obj in _places():
        seen_objects.add(obj.name)
        for f in obj.promised:
            view = walk.view(locator + f.steps)
            assert view is not None, f"{operation}: {obj.name}.{f.path} not in the baseline"
            found = set(view.shape.types or ()) | ({"null"} if view.shape.nullable else set())
            handled = set(f.types) | ({"integer"} if "number" in f.types else set())
            assert found and found <= handled, f"{obj.name}.{f.path}: {found} vs {f.types}"
    assert seen_objects == {o.name for o in OBJECTS}


def test_the_baseline_is_the_revision_and_date_this_release_pins() -> None:
    doc = baseline()
    assert doc.revision == "1.14.0" and doc.openapi.startswith("3.1.")
    assert doc.raw["info"]["x-revision-date"] == ApiSettings().version


def test_paths_are_split_and_joined_alike() -> None:
    for text in ("data[].status", "meta.pagination.limit", "urls.*", "events[]", ""):
        assert join_path(split_path(text)) == text
    assert split_path("data[].status") == ("data", "[]", "status")
