"""The modules of ``receiver/`` import each other without a cycle, and so do its packages.

The graph is read from the source (``ast``), not by importing, so a cycle that happens to work
at runtime today (because of import order, or because one side imports only for type checking
or only inside a function) still fails here. Every ``import``/``from ... import`` counts,
wherever it stands: at module level, under ``if TYPE_CHECKING:`` (a reader still has to hold both
modules to understand either), inside functions. ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, else to ``pkg``.

A parent package's ``__init__`` is not added as an implicit edge; the package ``__init__``
modules here are thin and import nothing that could close a circle.

Above the modules, the *rooms* of a package (its modules and its subpackages, each subpackage
taken whole) must not form a circle either: a module that imports a room built on it reaches up
into a layer above its own.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import receiver

ROOT = Path(receiver.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, wherever it stands."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


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
        for node in all_imports(tree):
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
    assert "receiver.config.settings" in graph and "receiver.events" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_cycle() -> None:
    """The checker itself: a planted cycle is found, an acyclic graph passes."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_type_checking_and_function_imports_are_edges() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import receiver.config.settings\n"
        "if TYPE_CHECKING:\n"
        "    import receiver.app\n"
        "def f():\n"
        "    import receiver.cli\n"
    )
    names = [a.name for n in all_imports(tree) for a in n.names]
    assert names == ["TYPE_CHECKING", "receiver.config.settings", "receiver.app", "receiver.cli"]


def rooms(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The graph of ``package``'s rooms: each module or subpackage directly inside it, with the
    rooms it imports (an import of a room's module is an import of the room)."""
    depth = package.count(".") + 1

    def room(module: str) -> str | None:
        parts = module.split(".")
        if not module.startswith(package + ".") or len(parts) <= depth:
            return None
        return ".".join(parts[: depth + 1])

    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if (here := room(module)) is None:
            continue
        out.setdefault(here, set())
        for target in targets:
            there = room(target)
            if there is not None and there != here:
                out[here].add(there)
                out.setdefault(there, set())
    return out


PACKAGES = sorted(
    module_name(path.parent)
    for path in ROOT.rglob("__init__.py")
    if "__pycache__" not in path.parts
)


@pytest.mark.parametrize("package", PACKAGES)
def test_the_rooms_of_each_package_import_each_other_without_a_cycle(package: str) -> None:
    """Inside ``receiver/`` (and each package in it), a subpackage counts as one room: e.g. the
    stages at the top (``config/``, ``intake/``, ``delivery/``, ...) import each other in one
    direction only, whichever of their modules the imports go through; in ``receiver.store``
    the backends stand on the interface, the interface on the model."""
    graph = rooms(import_graph(), package)
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle between the rooms of {package}: " + " -> ".join(
        cycle or []
    )


def test_the_room_check_finds_a_cycle_no_module_closes() -> None:
    """Two packages whose modules import each other's other modules: no module cycle, but the
    packages depend on each other, and the rooms of their parent say so."""
    graph = {
        "receiver.a.x": {"receiver.b.y"},
        "receiver.b.z": {"receiver.a.w"},
        "receiver.a.w": set(),
        "receiver.b.y": set(),
    }
    assert find_cycle(graph) is None
    assert find_cycle(rooms(graph, "receiver")) == ["receiver.a", "receiver.b", "receiver.a"]


# The stages of an event's path, one package each, and the packages beside them.
STAGES = ("config", "intake", "delivery", "upstream", "ops", "observe")
BESIDE = ("store", "sinks", "outbound", "pull", "cli", "simulator", "web")


def test_the_top_level_is_packages_by_stage_and_a_few_loose_modules() -> None:
    """A newcomer reads the architecture from the folder names; what stays loose is what every
    stage uses (errors, events, logs, signatures, retry policy, ...) or the wiring (app,
    server)."""
    for name in STAGES + BESIDE:
        assert (ROOT / name / "__init__.py").is_file(), name
    loose = sorted(p.stem for p in ROOT.glob("*.py") if not p.name.startswith("__"))
    assert len(loose) <= 13, f"{len(loose)} loose modules: {loose}"


def test_config_and_what_sinks_send_stand_below_every_stage() -> None:
    """The configuration (with the sink types' keys) and the outbound formats are read by every
    stage, so they import none of them."""
    graph = rooms(import_graph(), "receiver")
    stages = {f"receiver.{name}" for name in STAGES + BESIDE + ("app", "server")}
    assert graph["receiver.config"] & stages == {"receiver.outbound"}
    assert graph["receiver.outbound"] == {"receiver.events"}


def test_the_config_sections_import_nothing_built_on_them() -> None:
    graph = import_graph()
    assert "receiver.config.settings" in graph["receiver.config.sinks"]
    assert (
        graph["receiver.config.settings"] & {"receiver.config.sinks", "receiver.config.load"}
        == set()
    )


def test_the_store_model_imports_nothing_above_it() -> None:
    """The records, the query and lane types and the rules: modules that build only on each
    other, never on the interface or a backend."""
    model = {
        "receiver.store.records": set(),
        "receiver.store.asset_ledger": set(),
        "receiver.store.pull": set(),
        "receiver.store.lanes_model": {"receiver.store.records"},
        "receiver.store.browse": {"receiver.store.records"},
        "receiver.store.rules": {"receiver.store.records", "receiver.store.lanes_model"},
    }
    graph = import_graph()
    for name, allowed in model.items():
        store_imports = {t for t in graph[name] if t.startswith("receiver.store")}
        assert store_imports <= allowed, f"{name} imports {store_imports - allowed}"


def test_the_event_model_depends_on_nothing_in_receiver() -> None:
    """Config checks, templates and sinks all name the event types: they must stay at the root."""
    assert import_graph()["receiver.events"] == set()


def test_no_test_module_imports_another_test_module() -> None:
    """Shared helpers live in tests/support; a test module or conftest is never imported."""
    tests = ROOT.parent / "tests"
    offenders = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            else:
                continue
            for name in names:
                last = name.rsplit(".", 1)[-1]
                if name.startswith("tests.") and (last.startswith("test_") or last == "conftest"):
                    offenders.append(f"{path.relative_to(tests)} imports {name}")
    assert not offenders, offenders
