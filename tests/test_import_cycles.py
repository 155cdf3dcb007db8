"""No import cycle among the modules of the four packages.

The graph is read from the source with :mod:`ast`, so nothing is imported. Every ``import``
statement counts as an edge, at module level or inside a function: a lazy import that hides a
cycle at import time still ties the two modules into one unit that cannot be read, tested or
moved apart. ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to
``pkg``. Importing a module also runs its parent packages' ``__init__``, but that is not counted
as an edge: a package that re-exports its submodules would otherwise cycle with each of them.
The same holds one level up: the sub-packages of one package (``testbed.experiment``,
``testbed.studies``, ``testbed.results``, ...) import each other without a cycle, so that each
layer can be read from those below it. Imports under ``if TYPE_CHECKING:`` count too: two
modules that need each other's names, even only for annotations, belong in one module or need a
third one below both.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("controller", "emulator", "workloads", "testbed")


def _modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the four packages."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in the tree, at any depth."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module name a ``from ... import`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the four packages it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve(name, path, node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One concrete cycle through the component's first module, for the failure message."""
    members = set(component)
    start = component[0]
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    return component


def test_no_import_cycle() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(
        " -> ".join(_a_cycle(graph, c)) + f"   (component: {', '.join(c)})" for c in found)


def sub_package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Sub-package (``testbed.studies``) -> the sibling sub-packages its modules import; the
    modules at a package's top (``testbed.check``) belong to none."""
    packages = {m for m, path in _modules().items() if path.name == "__init__.py"}

    def unit(module: str) -> str | None:
        head = ".".join(module.split(".")[:2])
        return head if head in packages and head.count(".") == 1 else None

    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        src = unit(module)
        if src is None:
            continue
        out.setdefault(src, set()).update(
            dst for dst in map(unit, targets) if dst is not None and dst != src)
    return {src: targets & out.keys() for src, targets in out.items()}


def test_no_cycle_between_sub_packages() -> None:
    graph = sub_package_graph(import_graph())
    found = cycles(graph)
    assert not found, "sub-package cycles:\n" + "\n".join(
        " -> ".join(_a_cycle(graph, c)) for c in found)


def test_the_walker_sees_lazy_imports(tmp_path: Path) -> None:
    """A function-level import is an edge: the checker would miss hidden cycles otherwise."""
    tree = ast.parse("def f():\n    from workloads import schedule\n")
    assert [type(n).__name__ for n in _imports(tree)] == ["ImportFrom"]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
