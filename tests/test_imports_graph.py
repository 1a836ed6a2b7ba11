"""The project's import graph keeps its layers and has no cycles.

Every .py file under engine/, calibrate/, simulator/ and app/ is read with `ast` (nothing is
imported): all `import x` and `from x import y` statements, at module level and inside functions
or classes, relative ones resolved against the file's package. An import's edge goes to the
deepest project module it names: `from pkg import name` where pkg/name.py (or pkg/name/) exists is
an edge to pkg.name; otherwise (a class, a function, a constant) to pkg itself, its __init__.

Layers: the engine stands alone; calibrate may use the engine and the simulator; the simulator
never reaches into calibrate or the app; the CLI module is the app's top, imported by no other app
module. And no import cycles: no strongly connected component of more than one module, imports
under `if TYPE_CHECKING:` included (the messages mark them): a type-only import is a dependency
all the same, and two modules that need each other's types share them from a third (a protocol
in a types module).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "calibrate", "simulator", "app")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_files() -> dict[str, Path]:
    """Module name -> file, for every .py file of the four packages."""
    return {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_names(path: Path, module: str) -> list[tuple[int, str, list[str], bool]]:
    """(line, module, names, typing only) of every import in the file: `import a.b` is ("a.b", []),
    `from a import b, c` is ("a", ["b", "c"]), relative imports made absolute; typing only: under
    `if TYPE_CHECKING:` (counted all the same, but marked in the messages)."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, [], typing_only) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                if node.level - 1 > len(parts):
                    raise AssertionError(f"{path}:{node.lineno}: relative import beyond the top package")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.append((node.lineno, base, [alias.name for alias in node.names], typing_only))
        elif isinstance(node, ast.If) and is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, typing_only)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, typing_only)

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    return found


def deepest_module(name: str, modules: set[str]) -> str | None:
    """The longest prefix of a dotted name that is a project module (None: not the project's)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_edges() -> list[tuple[str, str, str]]:
    """(importer, imported project module, "file:line") for every import of a project module."""
    files = project_files()
    modules = set(files)
    edges = []
    for module, path in files.items():
        where = lambda line: f"{path.relative_to(ROOT)}:{line}"  # noqa: E731
        for line, name, names, typing_only in imported_names(path, module):
            targets = []
            if names:
                for item in names:
                    full = f"{name}.{item}" if name else item
                    targets.append(full if full in modules else name)
            else:
                targets.append(name)
            for target in targets:
                resolved = deepest_module(target, modules)
                edge = (module, resolved, where(line) + (", under TYPE_CHECKING" if typing_only else ""))
                if resolved is not None and resolved != module and edge not in edges:
                    edges.append(edge)
    return edges


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def describe(edges) -> str:
    return "\n".join(f"  {src} -> {dst}  ({where})" for src, dst, where in sorted(set(edges)))


def test_the_graph_reads_every_file():
    edges = import_edges()
    assert len(project_files()) > 50 and len(edges) > 100, "the walk found too little: check the paths"


@pytest.mark.parametrize("importer, forbidden", [
    ("simulator", ("calibrate", "app")),
    ("engine", ("calibrate", "simulator", "app")),
    ("calibrate", ("app",)),
])
def test_layers(importer, forbidden):
    bad = [e for e in import_edges()
           if in_package(e[0], importer) and any(in_package(e[1], f) for f in forbidden)]
    assert not bad, f"{importer} must not import {' or '.join(forbidden)}:\n{describe(bad)}"


def test_no_app_module_but_the_cli_imports_app_cli():
    bad = [e for e in import_edges() if e[1] == "app.cli" and in_package(e[0], "app") and e[0] != "app.cli"]
    assert not bad, f"app modules other than app/cli.py import app.cli:\n{describe(bad)}"


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components of the graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def test_strongly_connected_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert sorted(map(sorted, strongly_connected(graph))) == [["a", "b", "c"], ["d"], ["e"]]


def test_no_import_cycles():
    edges = import_edges()
    graph: dict[str, set[str]] = defaultdict(set)
    for module in project_files():
        graph[module]
    for src, dst, where in edges:
        graph[src].add(dst)
    cycles = [c for c in strongly_connected(graph) if len(c) > 1]
    lines = []
    for component in cycles:
        members = set(component)
        inside = [e for e in edges if e[0] in members and e[1] in members]
        lines.append(f"cycle of {len(component)} modules: {', '.join(component)}\n{describe(inside)}")
    assert not cycles, "import cycles:\n" + "\n".join(lines)
