"""Helpers the findings share: the finding record, lane names, launchers, import trees."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from typing import Any

from starttrace.analysis.model import Lane, RunModel, SpanNode, select
from starttrace.analysis.phases import merge_intervals

SEVERITIES = ("error", "warning", "info")
RANK_ROLES = ("worker", "child")  # roles whose processes are ranks (the EngineCore is not one)
try:  # the import-tree walks in C (starttrace/_modelcore.c, built at install where a C compiler is there)
    from starttrace import _modelcore  # type: ignore[attr-defined]

    c_import_children, c_subtree_modules = _modelcore.import_children, _modelcore.subtree_modules
    c_top_imports, c_covered_nodes = _modelcore.top_imports, _modelcore.covered_nodes
    c_pick_walk, c_paid_modules = _modelcore.pick_walk, _modelcore.paid_modules
    c_fastest_imports = _modelcore.fastest_imports  # findings.preload.FastestImports' pass
except ImportError:
    c_import_children = c_subtree_modules = c_top_imports = c_covered_nodes = c_pick_walk = c_paid_modules = None
    c_fastest_imports = None
WAIT_NAMES = ("barrier", "all_reduce", "allreduce", "all_gather", "broadcast", "collective", "wait_for")


def finding(
    kind: str,
    severity: str,
    lanes: Iterable[Lane],
    seconds: float | None,
    text: str,
    action: str,
    **extra: Any,
) -> dict[str, Any]:
    """One finding: `{kind, severity, pids, lanes, seconds, text, action}` plus kind-specific keys."""
    chosen = list(lanes)
    out: dict[str, Any] = {
        "kind": kind,
        "severity": severity,
        "pids": [ln.pid for ln in chosen if ln.pid is not None],
        "lanes": [ln.index for ln in chosen],
        "seconds": None if seconds is None else round(seconds, 6),
        "text": text,
        "action": action,
    }
    out.update(extra)
    return out


def by_pid(model: RunModel, per_lane: dict[int, float], digits: int = 6) -> dict[str, float]:
    """A per-lane measure keyed by the process's pid (as the JSON's keys: strings), rounded."""
    return {str(model.lanes[i].pid): round(v, digits) for i, v in per_lane.items()}


def short_name(lane: Lane) -> str:
    """How a finding names a process: `rank 1`, `EngineCore pid 7`, `forkserver pid 9`; in a run
    of several nodes with its node: `rank 9 (pid 7) on node2`."""
    where = f" on {lane.node}" if lane.node else ""
    if lane.rank is not None and lane.role == "worker":
        return (f"rank {lane.rank} (pid {lane.pid})" if lane.pid is not None else f"rank {lane.rank}") + where
    return lane.label + where


def s(seconds: float) -> str:
    """Seconds for a sentence: 3 significant decimals below 10 s, 1 above."""
    return (
        f"{seconds:.1f} s" if abs(seconds) >= 10 else f"{seconds:.2f} s" if abs(seconds) >= 0.1 else f"{seconds:.3f} s"
    )


def signed_s(seconds: float) -> str:
    return ("+" if seconds > 0 else "-" if seconds < 0 else "±") + s(abs(seconds))


def module_list(modules: list[str], limit: int | None = None) -> str:
    shown = modules if limit is None else modules[:limit]
    more = "" if limit is None or len(modules) <= limit else f", ... {len(modules) - limit} more"
    return "[" + ", ".join(shown) + more + "]"


def is_forkserver(lane: Lane) -> bool:
    return lane.role == "forkserver" or bool(select(lane.spans, ("forkserver_preload",)))


def launcher_lane(model: RunModel, lane: Lane) -> Lane | None:
    """The lane whose span started this one (a forkserver for its forks), else its parent by pid."""
    if lane.launched_by is not None and 0 <= lane.launched_by.lane < len(model.lanes):
        return model.lanes[lane.launched_by.lane]
    for other in model.lanes:
        if other.pid is not None and other.pid == lane.ppid and other is not lane:
            return other
    return None


def cutoff_ns(model: RunModel, lane: Lane) -> int:
    """Startup ends for a lane at the run's ready (else its own ready, else the run's end)."""
    ends = [t for t in (model.ready_ns, lane.ready_ns) if t is not None]
    return max(ends) if ends else model.t_end


def import_children(node: SpanNode) -> list[SpanNode]:
    """The imports directly inside `node` (through spans that are neither imports nor processes).
    Kept on the node: the findings ask ~3 times per span. Callers must not change the list."""
    if c_import_children is not None:
        return c_import_children(node, SpanNode)  # type: ignore[no-any-return]
    out = node.imports
    if out is None:
        children = node.children
        if all(child.phase == "import" for child in children):  # none, mostly: that very list, no copy
            node.imports = children
            return children
        out = node.imports = []
        for child in children:
            phase = child.phase
            if phase == "import":
                out.append(child)
            elif phase != "process" and phase != "startup":
                out.extend(import_children(child))
    return out


def top_imports(lane: Lane, until: int | None = None) -> list[SpanNode]:
    """The lane's imports that no other import encloses (completed, started before `until`)."""
    if c_top_imports is not None:
        return c_top_imports(lane.spans, until, SpanNode)  # type: ignore[no-any-return]
    out = []
    for n in lane.spans:
        if n.phase != "import" or n.in_progress or (until is not None and n.start >= until):
            continue
        p = n.parent_node
        steps = 0
        while p is not None and p.lane == n.lane and p.phase != "import":
            if steps >= 10_000:  # bounded: guards cycles (then it counts as enclosed)
                break
            steps += 1
            p = p.parent_node
        if p is None or p.lane != n.lane:
            out.append(n)
    return out


def subtree_modules(node: SpanNode, memo: dict[str, frozenset[str]]) -> frozenset[str]:
    """Modules loaded by the import `node` (itself and every import inside it)."""
    if c_subtree_modules is not None:
        return c_subtree_modules(node, memo, SpanNode)  # type: ignore[no-any-return]
    got = memo.get(node.id)
    if got is not None:
        return got
    result = frozenset(_modules_under([node]))
    memo[node.id] = result
    return result


def paid_modules(roots: list[SpanNode]) -> set[str]:
    """Modules loaded by the imports `roots` (themselves and every import inside them), in one set:
    the union of their `subtree_modules`, without a set per root."""
    if c_paid_modules is not None:
        return c_paid_modules(roots, SpanNode)  # type: ignore[no-any-return]
    return _modules_under(roots)


def _modules_under(roots: list[SpanNode]) -> set[str]:
    """The walk of `subtree_modules` and `paid_modules` (in C: `add_subtree_modules`)."""
    mods: set[str] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n.module:
            mods.add(n.module)
        stack.extend(import_children(n))
    return mods


def preload_list(lane: Lane) -> list[str]:
    """What a forkserver preloads: its `forkserver.preload` list, else its `preload X` spans."""
    for n in select(lane.spans, ("forkserver_preload",)):
        pre = n.attrs.get("starttrace.preload")
        if isinstance(pre, list):
            return [str(m) for m in pre]
    return [n.name[8:] for n in lane.spans if n.name.startswith("preload ")]


def preload_span(lane: Lane) -> SpanNode | None:
    outer = select(lane.spans, (), ("forkserver.preload",))
    if outer:
        return outer[0]
    parts = select(lane.spans, ("forkserver_preload",))
    return min(parts, key=lambda n: n.depth) if parts else None


def forkserver_modules(lane: Lane) -> set[str]:
    """Everything a forkserver holds for its children: its preload list, imports, preloaded."""
    out = set(preload_list(lane)) | set(lane.preloaded)
    out.update(n.module for n in select(lane.spans, ("import", "forkserver_preload")) if n.module)
    return out


def main_modules(model: RunModel) -> set[str]:
    """Names under which the program's `__main__` may be imported: never worth a preload."""
    names = {"__main__", "__mp_main__"}
    argv = model.meta.get("argv") if isinstance(model.meta, dict) else None
    if isinstance(argv, list):
        args = [str(a) for a in argv]
        for i, arg in enumerate(args[1:], 1):
            if arg == "-m" and i + 1 < len(args):
                names.add(args[i + 1])
                break
            if arg == "-c":
                break
            if not arg.startswith("-"):
                script = arg
                names.update(_modules_from_file(model, script))
                break
    return names


def _modules_from_file(model: RunModel, path: str) -> set[str]:
    want = posixpath.normpath(path)
    base = posixpath.basename(want)
    out = set()
    for n in select(model.spans, ("import",)):  # imports first: reading an attribute decodes it
        file = n.attrs.get("code.file.path")
        if isinstance(file, str) and posixpath.basename(file) == base:
            if file == want or file.endswith("/" + want.lstrip("./")):
                mod = n.module
                if mod:
                    out.add(mod)
    return out


def cuda_chains(model: RunModel) -> dict[str, tuple[Lane, list[str]]]:
    """Modules whose import ran `cuda.init`, with a lane where it happened and the chain."""
    out: dict[str, tuple[Lane, list[str]]] = {}
    for n in select(model.spans, ("cuda_init",), ("cuda.init",)):
        chain = [n.name]
        p = n.parent_node
        lane = model.lanes[n.lane]
        mods = []
        while p is not None and p.lane == n.lane and p.phase not in ("process", "startup"):
            chain.append(p.name)
            if p.phase in ("import", "forkserver_preload") and p.module:
                mods.append(p.module)
            elif p.name.startswith("preload "):
                mods.append(p.name[8:])
            p = p.parent_node
        chain.reverse()
        for mod in mods:
            out.setdefault(mod, (lane, chain))
    return out


def overlap_ns(a: tuple[int, int], intervals: Iterable[tuple[int, int]]) -> int:
    """How much of interval `a` the (merged) `intervals` cover."""
    total = 0
    for s0, e0 in merge_intervals(intervals):
        lo, hi = max(a[0], s0), min(a[1], e0)
        if hi > lo:
            total += hi - lo
    return total


def is_wait(n: SpanNode) -> bool:
    """A span in which a process waits for others (rendezvous, collective, a child's ready)."""
    name = n.name.lower()
    return n.phase == "dist_init" or any(w in name for w in WAIT_NAMES)
