"""The packages import each other in one direction: no module of ``streams`` or ``vigil_worker``
imports a module that imports it back, directly or through others. A circle makes the import
order decide what exists, and hides which layer depends on which."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("streams", "vigil_worker")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _imports(path: Path, known: set[str]) -> set[str]:
    """Every module ``path`` imports, at module level or inside a function (an import put off
    into a function still ties the two modules together), but not in ``if TYPE_CHECKING:``
    blocks, which only annotations read."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def _parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_no_import_circles() -> None:
    modules = _modules()
    known = set(modules)
    graph = {
        name: {m for m in _imports(path, known) if m != name and m not in _parents(name)}
        for name, path in modules.items()
    }
    # A package's __init__ importing its own submodules is how packages re-export; that edge
    # is allowed, the rest must form no cycle.
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name)
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)
