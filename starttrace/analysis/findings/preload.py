"""`preload` findings: what the ranks of one group pay for again after their fork or spawn.

A group is the ranks (processes of role `worker`, or generic multiprocessing children of one
role) that one process started: the ranks one forkserver forked, or the ranks one launcher spawned
or forked. Per group:

- paid: the modules each rank imported itself, before the run (or the rank) was ready;
- candidates: modules paid by two or more ranks of the group, except the program's `__main__`,
  anything whose import ran `cuda.init` (refused, with the chain), what the group's forkserver
  already holds, and failed imports;
- the covering list: walking each rank's import trees from the top, the first candidate on every
  branch; then, costliest first, a module is kept unless a kept one loaded it (a package that
  imports its submodules is listed once); modules under 0.1 ms per rank are left out;
- seconds: per rank, the time inside the imports that the list covers (measured);
- estimate: the change of time to ready if the list were preloaded (see `_estimate`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from starttrace.analysis.findings import common
from starttrace.analysis.findings.common import (
    RANK_ROLES,
    cuda_chains,
    cutoff_ns,
    finding,
    forkserver_modules,
    import_children,
    is_forkserver,
    launcher_lane,
    main_modules,
    module_list,
    paid_modules,
    preload_list,
    preload_span,
    s,
    short_name,
    signed_s,
    subtree_modules,
    top_imports,
)
from starttrace.analysis.model import Lane, RunModel, SpanNode, select

MIN_RANKS = 2
MIN_MODULE_S = 0.0001  # modules cheaper than this per rank are not listed
MIN_GROUP_S = 0.005  # groups that would save less than this per rank get no finding
MAX_MODULES = 40
SHOWN = 8  # modules named in a finding's text (all of them are in its `modules`)


@dataclass
class Group:
    role: str
    method: str  # forkserver | spawn | fork
    launcher: Lane | None
    lanes: list[Lane] = field(default_factory=list)


@dataclass
class Covering:
    modules: list[str]  # the list to preload, costliest first
    small: list[str]  # candidates left out (under MIN_MODULE_S per rank)
    per_lane_ns: dict[int, int]  # lane index -> seconds (ns) inside covered imports
    ranks_of: dict[str, list[int]]  # module -> lanes that paid it
    total_ns: dict[str, int]  # module -> time over the group's lanes
    refused: dict[str, str]  # module -> why it is not listed


def rank_groups(model: RunModel) -> list[Group]:
    """Ranks grouped by the process that started them and how (forkserver, spawn, fork)."""
    groups: dict[tuple[Any, ...], Group] = {}
    for lane in model.lanes:
        if lane.role not in RANK_ROLES or lane.start_method not in ("spawn", "fork", "forkserver"):
            continue
        launcher = launcher_lane(model, lane)
        method = "forkserver" if launcher is not None and is_forkserver(launcher) else str(lane.start_method)
        key = (lane.role, method, None if launcher is None else launcher.index)
        group = groups.setdefault(key, Group(str(lane.role), method, launcher))
        group.lanes.append(lane)
    return [g for g in groups.values() if len(g.lanes) >= MIN_RANKS]


def preload_findings(model: RunModel) -> list[dict[str, Any]]:
    out = []
    tainted = cuda_chains(model)
    excluded = main_modules(model)
    fastest = FastestImports(model)
    for group in rank_groups(model):
        cover = covering(model, group, tainted, excluded)
        if not cover.modules:
            if cover.refused:
                out.append(_refused_only(group, cover))
            continue
        per_rank = [cover.per_lane_ns.get(ln.index, 0) / 1e9 for ln in group.lanes]
        mean = sum(per_rank) / len(per_rank)
        if mean < MIN_GROUP_S:
            continue
        out.append(_finding(model, group, cover, per_rank, mean, fastest))
    return out


def covering(model: RunModel, group: Group, tainted: dict[str, tuple[Lane, list[str]]], excluded: set[str]) -> Covering:
    memo: dict[str, frozenset[str]] = {}
    tops = {ln.index: top_imports(ln, cutoff_ns(model, ln)) for ln in group.lanes}
    count: Counter[str] = Counter()
    for roots in tops.values():
        count.update(paid_modules(roots))
    held = forkserver_modules(group.launcher) if group.method == "forkserver" and group.launcher else set()

    # the candidates, decided once per module (the walk below asks for every import span)
    allowed = {
        mod
        for mod, ranks in count.items()
        if mod
        and ranks >= MIN_RANKS
        and mod not in excluded
        and mod not in tainted
        and mod not in held
        and not mod.startswith("starttrace")
    }
    picks: dict[str, list[SpanNode]] = {}
    refused: dict[str, str] = {}
    flagged = {mod for mod in tainted if count[mod] >= MIN_RANKS}
    if not allowed and not flagged:  # no module two ranks paid for: nothing to pick or refuse
        return _keep(group, picks, memo, refused, {})
    if common.c_pick_walk is not None:  # the same walk in C
        for roots in tops.values():
            picked, noted = common.c_pick_walk(roots, allowed, flagged, SpanNode)
            for n in picked:
                picks.setdefault(n.module, []).append(n)
            for n in noted:
                if n.module not in refused:
                    refused[n.module] = _refusal(tainted[n.module])
        return _keep(group, picks, memo, refused, {ln.index: cutoff_ns(model, ln) for ln in group.lanes})
    for roots in tops.values():
        stack = list(roots)
        while stack:
            n = stack.pop()
            mod = n.module
            if mod in allowed and not n.error:
                picks.setdefault(mod, []).append(n)
                continue
            if mod in flagged and mod not in refused:
                refused[mod] = _refusal(tainted[mod])
            stack.extend(import_children(n))
    return _keep(group, picks, memo, refused, {ln.index: cutoff_ns(model, ln) for ln in group.lanes})


def _refusal(taint: tuple[Lane, list[str]]) -> str:
    where, chain = taint
    return f"its import ran cuda.init in {where.label} ({' -> '.join(chain)})"


def _keep(
    group: Group,
    picks: dict[str, list[SpanNode]],
    memo: dict[str, frozenset[str]],
    refused: dict[str, str],
    lane_until: dict[int, int],
) -> Covering:
    """Costliest first, keep a module unless a kept one loaded it; then the time each rank spent
    inside the imports the kept list covers."""
    total = {mod: sum(n.duration for n in nodes) for mod, nodes in picks.items()}
    n_lanes = len(group.lanes)
    kept: list[str] = []
    small: list[str] = []
    covered: set[str] = set()
    for mod in sorted(picks, key=lambda m: (-total[m], m)):
        if mod in covered:
            continue
        if total[mod] / n_lanes / 1e9 < MIN_MODULE_S or len(kept) >= MAX_MODULES:
            small.append(mod)
            continue
        kept.append(mod)
        covered.add(mod)
        for n in picks[mod]:
            covered |= subtree_modules(n, memo)
    per_lane: dict[int, int] = {}
    for lane in group.lanes:
        found = covered_nodes(lane, covered, lane_until.get(lane.index)) if covered else []
        per_lane[lane.index] = sum(n.duration for n in found)
    ranks_of = {mod: sorted({n.lane for n in nodes}) for mod, nodes in picks.items()}
    return Covering(kept, small, per_lane, ranks_of, total, refused)


def covered_nodes(lane: Lane, covered: set[str], until: int | None = None) -> list[SpanNode]:
    """The outermost imports of `lane` (started before `until`) whose module is in `covered`."""
    if common.c_covered_nodes is not None:
        return common.c_covered_nodes(top_imports(lane, until), covered, SpanNode)  # type: ignore[no-any-return]
    out = []
    stack = top_imports(lane, until)
    while stack:
        n = stack.pop()
        if n.module in covered:
            out.append(n)
        else:
            stack.extend(import_children(n))
    return out


def _estimate(
    model: RunModel, group: Group, per_rank: list[float], modules: list[str], fastest: FastestImports
) -> dict[str, Any]:
    """Change of time to ready if the list were preloaded (an estimate, labelled as one).

    Each rank would be done earlier by its measured re-import seconds (spawned ranks also skip
    their interpreter start); the preload is paid once, before the first fork: the cheapest
    rank's re-import, or the sum of the fastest import of each listed module anywhere in the run
    if less (the ranks import under each other's contention; the forkserver would import alone),
    less the time the forkserver sat idle before its first fork. It changes time to ready only if
    a rank of the group is on the critical path, or a critical-path step of the process that
    started them spans the moment the last rank was done (it waited for them), or the run has no
    ready (it is assumed to wait for its ranks)."""
    saved = [int(x * 1e9) for x in per_rank]
    done = [ln.ready_ns if ln.ready_ns is not None else ln.end for ln in group.lanes]
    init = [ln.phases.get("interpreter", 0) if group.method == "spawn" else 0 for ln in group.lanes]
    cost = min(min(saved), fastest.total(modules))
    if group.method == "forkserver" and group.launcher is not None:
        slack = _idle_before_first_fork(group.launcher)
        added = max(0, cost - slack)
        basis = f"the preload runs once in {group.launcher.label} before its first fork"
        if slack >= 1_000_000:
            basis += f" (it sat idle {s(slack / 1e9)} before it)"
    else:
        added = cost + min(init)
        basis = "a forkserver, started when the ranks are, pays one interpreter start and the preload, then forks them"
    new_done = max(d - sv - i for d, sv, i in zip(done, saved, init, strict=True)) + added
    delta = new_done - max(done)
    indices = {ln.index for ln in group.lanes}
    launcher = group.launcher.index if group.launcher is not None else None
    last = max(done)
    on_path = any(
        st.lane in indices or (st.lane == launcher and st.start < last <= st.end) for st in model.critical_path
    )
    if model.ready_ns is None:
        on_path = True
        basis += "; the run has no ready: it is assumed to wait for its slowest rank"
    elif not on_path:
        basis += "; no rank of the group is on the critical path"
    return {
        "label": "estimate",
        "time_to_ready_s": round(delta / 1e9, 6) if on_path else 0.0,
        "group_done_s": round(delta / 1e9, 6),
        "on_critical_path": on_path,
        "preload_cost_s": round(added / 1e9, 6),
        "basis": basis,
    }


class FastestImports:
    """The fastest completed import of each module anywhere in the run, found in one pass over the
    run's imports the first time a group asks (a pass per group cost a 64-rank run ~0.5 s)."""

    def __init__(self, model: RunModel) -> None:
        self.model = model
        self._best: dict[str | None, int] | None = None

    def total(self, modules: list[str]) -> int:
        """The sum of the fastest import of each of `modules`; 2**62 when one never completed."""
        best = self._best
        if best is None:
            imports = select(self.model.spans, ("import",))
            if common.c_fastest_imports is not None:  # the same pass in C
                best = self._best = common.c_fastest_imports(imports, SpanNode)
            else:
                best = self._best = {}
                for n in imports:
                    if n.in_progress or n.error:
                        continue
                    old = best.get(n.module)
                    if old is None or n.duration < old:
                        best[n.module] = n.duration
        total = 0
        for mod in set(modules):
            got = best.get(mod)
            if got is None:
                return 1 << 62
            total += got
        return total


def _idle_before_first_fork(forkserver: Lane) -> int:
    pre = preload_span(forkserver)
    forks = [n.start for n in forkserver.spans if n.phase == "fork" or n.name == "process.fork"]
    if pre is None or not forks:
        return 0
    return max(0, min(forks) - pre.eff_end)


def _refused_only(group: Group, cover: Covering) -> dict[str, Any]:
    """The ranks re-import only modules whose import ran cuda.init: nothing to preload, and why."""
    names = sorted(cover.refused)
    text = (
        f"{len(group.lanes)} ranks re-import {module_list(names, SHOWN)} after their {group.method}, but their "
        f"import ran cuda.init: not preloadable ({cover.refused[names[0]]})"
    )
    return finding(
        "preload",
        "info",
        group.lanes,
        0.0,
        text,
        "make their import CUDA-clean (no torch.cuda calls at import time) before preloading them",
        modules=[],
        modules_detail=[],
        small_modules={"count": 0, "seconds_per_rank": 0.0},
        per_rank=[],
        start_method=group.method,
        role=group.role,
        forkserver_pid=group.launcher.pid if group.method == "forkserver" and group.launcher else None,
        launcher_pid=group.launcher.pid if group.launcher else None,
        preloads_now=preload_list(group.launcher) if group.method == "forkserver" and group.launcher else [],
        refused=[{"module": m, "reason": cover.refused[m]} for m in names],
        estimate={
            "label": "estimate",
            "time_to_ready_s": 0.0,
            "on_critical_path": False,
            "basis": "nothing to preload",
        },
    )


def _wording(
    model: RunModel, group: Group, mods: list[str], per_rank: list[float], mean: float, est: dict[str, Any]
) -> tuple[str, str]:
    """The finding's text and action, in the words of how the ranks were started."""
    n = len(group.lanes)
    each = ", ".join(f"{short_name(ln)} {s(x)}" for ln, x in zip(group.lanes, per_rank, strict=True))
    change = f"estimated change of time to ready: {signed_s(est['time_to_ready_s'])} (estimate; {est['basis']})"
    try_it = (
        f"STARTTRACE_FORKSERVER_PRELOAD=$(starttrace advise {model.run_id} --preload-list | tail -n 1) CMD"
        " (or: starttrace run --preload <that list> -- CMD)"
    )
    if group.method == "forkserver" and group.launcher is not None:
        fs = group.launcher
        now = preload_list(fs)
        text = (
            f"{n} ranks forked from {fs.label} re-import modules after their fork: {s(mean)} per rank ({each}). "
            f"Add {module_list(mods, SHOWN)} to the preload of {fs.label} (it preloads {module_list(now, SHOWN)} now); "
            f"{change}."
        )
        action = (
            f"try it: {try_it}, then `starttrace compare {model.run_id} <new run>`; to keep it, add them to "
            "multiprocessing.set_forkserver_preload(...) before the forkserver starts (with Python 3.14's "
            "default start method it starts at the first Process.start(): call it before that)"
        )
        return text, action
    by = group.launcher.label if group.launcher is not None else "their parent"
    text = (
        f"{n} ranks {'spawned' if group.method == 'spawn' else 'forked'} by {by} re-import modules after "
        f"their {group.method}: {s(mean)} per rank ({each}). Start them from a forkserver that preloads "
        f"{module_list(mods, SHOWN)}; {change}."
    )
    action = "start the ranks with the forkserver start method and multiprocessing.set_forkserver_preload([...])"
    if any(ln.role in ("api_server", "engine_core") for ln in model.lanes):
        action += (
            f"; vLLM: VLLM_WORKER_MULTIPROC_METHOD=forkserver with {try_it} "
            "(where vLLM forks its workers; its CPU platform forces spawn)"
        )
    return text, action


def _finding(
    model: RunModel, group: Group, cover: Covering, per_rank: list[float], mean: float, fastest: FastestImports
) -> dict[str, Any]:
    mods = cover.modules
    est = _estimate(model, group, per_rank, mods, fastest)
    text, action = _wording(model, group, mods, per_rank, mean, est)
    small_s = sum(cover.total_ns.get(m, 0) for m in cover.small) / len(group.lanes) / 1e9
    forkserver = group.launcher if group.method == "forkserver" else None
    return finding(
        "preload",
        "warning" if mean >= 1.0 else "info",
        group.lanes,
        mean,
        text,
        action,
        modules=mods,
        modules_detail=[
            {
                "module": m,
                "ranks": len(cover.ranks_of.get(m, [])),
                "seconds_per_rank": round(cover.total_ns[m] / max(1, len(cover.ranks_of.get(m, []))) / 1e9, 6),
            }
            for m in mods
        ],
        small_modules={"count": len(cover.small), "seconds_per_rank": round(small_s, 6)},
        per_rank=[
            {"lane": ln.index, "pid": ln.pid, "label": ln.label, "rank": ln.rank, "seconds": round(x, 6)}
            for ln, x in zip(group.lanes, per_rank, strict=True)
        ],
        start_method=group.method,
        role=group.role,
        forkserver_pid=forkserver.pid if forkserver else None,
        launcher_pid=group.launcher.pid if group.launcher else None,
        preloads_now=preload_list(forkserver) if forkserver else [],
        refused=[{"module": m, "reason": r} for m, r in sorted(cover.refused.items())],
        estimate=est,
    )
