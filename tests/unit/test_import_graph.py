"""The modules of ``receiver/`` import each other without a cycle.

The graph is read from the source (``ast``), not by importing, so a cycle that happens to work
at runtime today (because of import order) still fails here. What counts as an edge:

- module-level ``import``/``from ... import`` statements, including those inside ``try``/``if``
  blocks at module level: they run when the module is imported;
- ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``.

What does not count:

- imports under ``if TYPE_CHECKING:``: they never run, they only name types for mypy;
- imports inside functions and methods: they run late, on purpose (optional extras, the
  command bodies that load only what they need).

A parent package's ``__init__`` is not added as an implicit edge; the package ``__init__``
modules here are thin and import nothing that could close a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import receiver

ROOT = Path(receiver.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_level_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements run at import time: not in functions, classes or TYPE_CHECKING."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not is_type_checking(node.test):
                yield from module_level_imports(node.body)
            yield from module_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from module_level_imports(block)
            for handler in node.handlers:
                yield from module_level_imports(handler.body)


def resolve(node: ast.ImportFrom, current: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in module_level_imports(tree.body):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                pkg = resolve(node, name, path.name == "__init__.py")
                targets = [
                    f"{pkg}.{alias.name}" if f"{pkg}.{alias.name}" in files else pkg
                    for alias in node.names
                ]
            graph[name].update(t for t in targets if t in files and t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path of module names (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_receiver_modules_import_without_a_cycle() -> None:
    graph = import_graph()
    assert "receiver.config" in graph and "receiver.events" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_cycle() -> None:
    """The checker itself: a planted cycle is found, an acyclic graph passes."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_type_checking_imports_are_not_edges() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import receiver.config\n"
        "if TYPE_CHECKING:\n"
        "    import receiver.app\n"
        "def f():\n"
        "    import receiver.cli\n"
    )
    names = [a.name for n in module_level_imports(tree.body) for a in n.names]
    assert names == ["TYPE_CHECKING", "receiver.config"]


def test_the_event_model_depends_on_nothing_in_receiver() -> None:
    """Config checks, templates and sinks all name the event types: they must stay at the root."""
    assert import_graph()["receiver.events"] == set()
