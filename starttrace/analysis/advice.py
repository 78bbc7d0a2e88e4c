"""Derived advice over a waterfall model: forkserver preload advice and the CUDA-clean audit."""

from __future__ import annotations

from typing import Any

from starttrace.analysis.model import Lane, RunModel, SpanNode, rank_slot

FORKED = ("fork", "forkserver")
MIN_RANKS = 2
MAX_ADVICE = 25


def _preloaded_modules(model: RunModel) -> set[str]:
    """Modules a forkserver already holds: its imports, its preload list, what it had loaded."""
    out: set[str] = set()
    for lane in model.lanes:
        is_fs = lane.role == "forkserver" or any(n.phase == "forkserver_preload" for n in lane.spans)
        for n in lane.spans:
            pre = n.attrs.get("starttrace.preload")
            if isinstance(pre, list):
                out.update(str(m) for m in pre)
            if is_fs and n.phase in ("import", "forkserver_preload"):
                mod = n.module or (n.name[8:] if n.name.startswith("preload ") else None)
                if mod:
                    out.add(mod)
        if is_fs:
            out.update(lane.preloaded)
    return out


def _is_rank_process(lane: Lane) -> bool:
    if lane.start_method in ("root", "exec"):
        return False
    return lane.rank is not None or lane.role in ("worker", "engine_core") or lane.start_method in (*FORKED, "spawn")


def preload_advice(model: RunModel) -> list[dict[str, Any]]:
    """Modules that two or more rank processes imported themselves (after their fork / spawn) and
    that no forkserver preloaded. Only the top of each import tree is advised (preloading it loads
    what it imports). saving_per_rank_s: mean time one rank spent importing it."""
    preloaded = _preloaded_modules(model)
    acc: dict[str, dict[str, Any]] = {}
    for lane in model.lanes:
        if not _is_rank_process(lane):
            continue
        inherited = set(lane.preloaded) if lane.start_method in FORKED else set()
        seen_here: set[str] = set()
        for n in lane.spans:
            if n.phase != "import" or n.in_progress:
                continue
            if n.parent_node is not None and n.parent_node.phase == "import":
                continue
            mod = n.module
            if not mod or mod in preloaded or mod in inherited or mod in seen_here:
                continue
            seen_here.add(mod)
            a = acc.setdefault(mod, {"slots": set(), "total": 0, "methods": set(), "lanes": []})
            a["slots"].add(rank_slot(lane))
            a["total"] += n.duration
            a["methods"].add(lane.start_method or "unknown")
            a["lanes"].append(lane.index)
    out = []
    for mod, a in acc.items():
        ranks = len(a["slots"])
        if ranks < MIN_RANKS:
            continue
        per_rank = a["total"] / len(a["lanes"]) / 1e9
        methods = sorted(a["methods"])
        if set(methods) <= set(FORKED):
            how = f"add {mod!r} to the forkserver preload (multiprocessing.set_forkserver_preload)"
        else:
            how = f"start the ranks with forkserver and preload {mod!r}"
        out.append(
            {
                "module": mod,
                "ranks": ranks,
                "saving_per_rank_s": round(per_rank, 6),
                "total_s": round(a["total"] / 1e9, 6),
                "start_methods": methods,
                "lanes": a["lanes"],
                "advice": how,
            }
        )
    out.sort(key=lambda d: (-d["total_s"], d["module"]))
    return out[:MAX_ADVICE]


def _chain(n: SpanNode, lane_index: int) -> list[str]:
    names: list[str] = []
    p = n.parent_node
    while p is not None and p.lane == lane_index and p.phase not in ("process", "startup") and len(names) < 200:
        names.append(p.name)
        p = p.parent_node
    names.reverse()
    names.append(n.name)
    return names


def _is_fork(n: SpanNode) -> bool:
    if n.phase == "fork" or n.name == "process.fork":
        return True
    if n.phase == "launch" or n.name == "process.launch":
        return n.attrs.get("starttrace.start_method") == "fork"
    return False


def cuda_audit(model: RunModel) -> dict[str, Any]:
    """Processes that initialized CUDA and then forked (a forked child inherits a CUDA context it
    cannot use), and forkservers that initialized CUDA at all (e.g. through a preloaded module).
    Each issue carries the chain of spans that led to `cuda.init` (import a -> import b -> cuda.init)."""
    issues: list[dict[str, Any]] = []
    cuda_lanes = 0
    for lane in model.lanes:
        cudas = [n for n in lane.spans if n.phase == "cuda_init" or n.name == "cuda.init"]
        flagged = bool(lane.resource.get("starttrace.cuda_before_fork") is True) or any(
            n.attrs.get("starttrace.cuda_before_fork") is True for n in lane.spans if n.phase == "process"
        )
        if cudas:
            cuda_lanes += 1
        is_fs = lane.role == "forkserver" or any(n.phase == "forkserver_preload" for n in lane.spans)
        for c in cudas:
            forks = [n for n in lane.spans if _is_fork(n) and n.start >= c.start]
            in_preload = None
            p = c.parent_node
            while p is not None and p.lane == lane.index:
                if p.phase == "forkserver_preload":
                    in_preload = p.name
                    break
                p = p.parent_node
            if not forks and not is_fs:
                continue
            kind = "forkserver_cuda" if is_fs else "cuda_before_fork"
            issues.append(
                {
                    "kind": kind,
                    "lane": lane.index,
                    "label": lane.label,
                    "role": lane.role,
                    "rank": lane.rank,
                    "pid": lane.pid,
                    "cuda_init_s": model.seconds(c.start),
                    "cuda_error": c.error,
                    "chain": _chain(c, lane.index),
                    "in_preload": in_preload,
                    "forks": [
                        {
                            "name": f.name,
                            "child_pid": f.attrs.get("starttrace.child_pid"),
                            "start_s": model.seconds(f.start),
                        }
                        for f in forks[:20]
                    ],
                    "severity": "warning" if c.error else "error",
                }
            )
        if flagged and not any(i["lane"] == lane.index for i in issues):
            issues.append(
                {
                    "kind": "cuda_before_fork",
                    "lane": lane.index,
                    "label": lane.label,
                    "role": lane.role,
                    "rank": lane.rank,
                    "pid": lane.pid,
                    "cuda_init_s": None,
                    "cuda_error": None,
                    "chain": [],
                    "in_preload": None,
                    "forks": [],
                    "severity": "error",
                }
            )
    return {"clean": not issues, "processes_with_cuda_init": cuda_lanes, "issues": issues}
