"""The layers of docs/design.md, checked on the source: data flows one way (hot path -> sources ->
analysis -> views -> entry points), and no module imports another that (directly or not) imports it
back — lazy imports inside functions included.

The hot path is a folder, starttrace/tracer/ (boot, recorder, journal, lifecycle, launchers,
probes/): every module in it imports the standard library and the folder only (lazy
imports included), asks `sys.modules` for no starttrace module in place of an import, and its
modules import each other without a cycle."""

from __future__ import annotations

import ast
import itertools
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "starttrace"
TRACER = PACKAGE / "tracer"
HOT_PATH = "starttrace.tracer"  # the folder: this package and every module under it

# layer -> the starttrace layers it may import (besides itself)
ALLOWED = {
    "hot": {"hot"},  # not even the root package's __init__ (the `.pth` line imports it anyway)
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
    if module == HOT_PATH or module.startswith(HOT_PATH + "."):
        return "hot"
    if module == "starttrace.run" or module.startswith("starttrace.run."):
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


def _tracer_modules() -> list[tuple[str, Path, ast.Module]]:
    return [
        (_module_name(path), path, ast.parse(path.read_text(encoding="utf-8"))) for path in sorted(TRACER.rglob("*.py"))
    ]


def _absolute(node: ast.ImportFrom, module: str, path: Path) -> str:
    base = node.module or ""
    if node.level:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        parts = package.split(".")
        base = ".".join([*parts[: len(parts) - node.level + 1], base]).strip(".")
    return base


def test_the_folder_is_the_hot_path() -> None:
    """The hot path's modules (and its C core) live in the folder, none of them beside it."""
    moved = ("boot", "recorder", "journal", "launchers")
    for name in (*moved, "lifecycle"):
        assert (TRACER / f"{name}.py").exists(), name
    assert (TRACER / "probes" / "__init__.py").exists()
    assert (TRACER / "_hotpath.c").exists()
    assert not [name for name in moved if (PACKAGE / f"{name}.py").exists()]
    assert not (PACKAGE / "probes").exists() and not (PACKAGE / "_hotpath.c").exists()
    assert {_layer(module) for module, _, _ in _tracer_modules()} == {"hot"}
    assert not [m for m in GRAPH if _layer(m) == "hot" and not m.startswith(HOT_PATH)]


def test_the_hot_path_imports_only_the_standard_library_and_the_folder() -> None:
    """Every import in the folder, at module level or inside a function: the standard library or
    starttrace.tracer (never starttrace's root package or another layer)."""
    wrong = []
    for module, path, tree in _tracer_modules():
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, module, path)
                names = [base]
                if base == "starttrace":  # `from starttrace import x`: x is a module of the root
                    names = [f"starttrace.{a.name}" for a in node.names]
            for name in names:
                top = name.split(".")[0]
                if top == "starttrace":
                    if not (name == HOT_PATH or name.startswith(HOT_PATH + ".")):
                        wrong.append(f"{module} imports {name}")
                elif top not in sys.stdlib_module_names:
                    wrong.append(f"{module} imports {name} (not the standard library)")
    assert not wrong, wrong


def _names_a_module_outside(value: str) -> bool:
    return (value in GRAPH and _layer(value) != "hot") or value in ("starttrace", "starttrace._modelcore")


def test_the_hot_path_names_no_module_outside_the_folder_to_import() -> None:
    """Probe tables, `__import__(name)`, `import_unrecorded(name)`: a module name in a string is an
    import too. Only a helper process the tracer starts (`python -m starttrace.follower`) may name
    a module outside the folder: it runs apart, never inside the traced process."""
    wrong = []
    for module, _, tree in _tracer_modules():
        helpers: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.List, ast.Tuple)):
                for before, after in itertools.pairwise(node.elts):
                    if isinstance(before, ast.Constant) and before.value == "-m":
                        helpers.add(id(after))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in helpers:
                if node.value.startswith("starttrace.") and _names_a_module_outside(node.value):
                    wrong.append(f"{module}: {node.value!r}")
    assert not wrong, wrong


def _is_sys_modules(node: ast.AST) -> bool:
    """`sys.modules`, or a local name bound to it (`modules = sys.modules`)."""
    if isinstance(node, ast.Attribute) and node.attr == "modules":
        return isinstance(node.value, ast.Name) and node.value.id == "sys"
    return isinstance(node, ast.Name) and node.id == "modules"


def _names_starttrace(key: ast.AST) -> bool:
    for sub in ast.walk(key):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value.startswith("starttrace"):
            return True
        if isinstance(sub, ast.Name) and sub.id == "__name__":
            return True
    return False


def test_no_sys_modules_lookup_stands_in_for_an_import() -> None:
    """`sys.modules.get("starttrace...")`, `sys.modules["starttrace..."]`, `"starttrace..." in
    sys.modules`: a hidden dependency (an import the graph above does not see). The folder imports
    what it uses; what a lazily loaded probe offers is in `lifecycle.loaded_probes`."""
    wrong = []
    for module, _, tree in _tracer_modules():
        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Subscript) and _is_sys_modules(node.value):
                key = node.slice
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and _is_sys_modules(node.func.value)
                and node.args
            ):
                key = node.args[0]
            elif isinstance(node, ast.Compare) and any(_is_sys_modules(c) for c in node.comparators):
                key = node.left
            if key is not None and _names_starttrace(key):
                wrong.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    assert not wrong, wrong


def _top_level_imports(module: str, path: Path, tree: ast.Module) -> set[str]:
    """What importing `module` imports at once: its module-level statements (inside `if`/`try` too),
    not the bodies of functions and classes, nor `if TYPE_CHECKING:` (False at run time)."""
    found: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, module, path)
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, node.orelse, node.finalbody, *[h.body for h in node.handlers]):
                    visit(block)
            elif isinstance(node, ast.With):
                visit(node.body)

    visit(tree.body)
    return found


def test_the_folder_has_no_import_cycle() -> None:
    """Inside starttrace/tracer/, module-level imports form no cycle (a submodule imports its
    package first: that edge counts too, so a package may not import its own submodules at module
    level either)."""
    modules = {module: (path, tree) for module, path, tree in _tracer_modules()}
    edges: dict[str, set[str]] = {}
    for module, (path, tree) in modules.items():
        deps = {d for d in _top_level_imports(module, path, tree) if d in modules and d != module}
        parent = module.rpartition(".")[0]
        while parent.startswith(HOT_PATH):
            if parent in modules:
                deps.add(parent)
            parent = parent.rpartition(".")[0]
        edges[module] = deps
    assert "starttrace.tracer.lifecycle" in edges["starttrace.tracer.probes.multiprocessing"]
    assert "starttrace.tracer.boot" not in edges["starttrace.tracer.probes.multiprocessing"]
    order: list[str] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(v: str, path: list[str]) -> None:
        state[v] = 1
        for w in sorted(edges[v]):
            if state.get(w) == 1:
                pytest.fail("import cycle in starttrace/tracer/: " + " -> ".join([*path[path.index(w) :], w]))
            if w not in state:
                visit(w, [*path, w])
        state[v] = 2
        order.append(v)

    for v in sorted(edges):
        if v not in state:
            visit(v, [v])
    assert len(order) == len(modules)


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
