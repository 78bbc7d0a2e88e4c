"""The layers of docs/design.md, checked on the source: data flows one way (hot path -> sources ->
analysis -> views -> entry points), the hot path imports only the standard library, and no module
imports another that (directly or not) imports it back — lazy imports inside functions included."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "starttrace"

HOT_PATH = (
    "starttrace.boot",
    "starttrace.recorder",
    "starttrace.journal",
    "starttrace.probes",
    "starttrace.probes.torchelastic",  # (covered by the prefix above; named: it runs inside torchrun agents)
    "starttrace.launchers",
    "starttrace.nodeinfo",
)
# layer -> the starttrace layers it may import (besides itself)
ALLOWED = {
    "hot": {"hot", "root"},
    "run": {"root"},
    "sources": {"hot", "run", "root"},
    "analysis": {"run", "root"},
    "views": {"analysis", "run", "root", "hot"},
    "entry": {"hot", "run", "sources", "analysis", "views", "entry", "root"},
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> str:
    if module == "starttrace":
        return "root"
    if module.startswith(HOT_PATH):
        return "hot"
    if module == "starttrace.run":
        return "run"
    second = module.split(".")[1]
    return {"sources": "sources", "analysis": "analysis", "views": "views"}.get(second, "entry")


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        deps: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join([*parts[: len(parts) - node.level + 1], base]).strip(".")
                deps.add(base)
                deps.update(f"{base}.{alias.name}" for alias in node.names)
        graph[module] = deps
    modules = set(graph)
    return {m: {d for d in deps if d in modules and d != m} for m, deps in graph.items()}


GRAPH = _imports()


def test_the_graph_is_read() -> None:
    assert len(GRAPH) > 30
    assert "starttrace.analysis.model" in GRAPH["starttrace.analysis.lanes"]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_follow_the_layers(module: str) -> None:
    layer = _layer(module)
    wrong = sorted(d for d in GRAPH[module] if _layer(d) != layer and _layer(d) not in ALLOWED[layer])
    assert not wrong, f"{module} ({layer}) imports {wrong}"


def test_the_hot_path_imports_only_the_standard_library() -> None:
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        if _layer(module) != "hot":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                assert top == "starttrace" or top in sys.stdlib_module_names, f"{module} imports {name}"


def test_the_hot_path_never_imports_future() -> None:
    """`from __future__ import annotations` would load `__future__` at activation: a module the
    program may import later (zero footprint), and activation cost (docs/benchmarks.md)."""
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        if _layer(module) != "hot":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                pytest.fail(f"{module} imports __future__")


def test_no_import_cycle() -> None:
    # modules are nodes; importing a submodule imports its package first
    edges = {m: set(deps) for m, deps in GRAPH.items()}
    for m in GRAPH:
        parent = m.rpartition(".")[0]
        while parent:
            if parent in edges:
                edges[m].add(parent)
            parent = parent.rpartition(".")[0]
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
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
                cycles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    # a package's __init__ importing its own submodules is not a cycle of layers: leave those out
    real = [c for c in cycles if not all(x.startswith(min(c, key=len) + ".") or x == min(c, key=len) for x in c)]
    assert not real, f"import cycles: {real}"
