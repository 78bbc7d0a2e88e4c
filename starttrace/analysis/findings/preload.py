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

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from starttrace.analysis.findings.common import (
    RANK_ROLES,
    cuda_chains,
    cutoff_ns,
    finding,
    forkserver_modules,
    is_forkserver,
    launcher_lane,
    main_modules,
    module_list,
    outermost_map,
    outermost_rows,
    preload_list,
    preload_span,
    s,
    short_name,
    signed_s,
    tree_rows,
)
from starttrace.analysis.model import Lane, RunModel

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
        method = "forkserver" if launcher is not None and is_forkserver(model, launcher) else str(lane.start_method)
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
                out.append(_refused_only(model, group, cover))
            continue
        per_rank = [cover.per_lane_ns.get(ln.index, 0) / 1e9 for ln in group.lanes]
        mean = sum(per_rank) / len(per_rank)
        if mean < MIN_GROUP_S:
            continue
        out.append(_finding(model, group, cover, per_rank, mean, fastest))
    return out


def covering(model: RunModel, group: Group, tainted: dict[str, tuple[Lane, list[str]]], excluded: set[str]) -> Covering:
    until = {ln.index: cutoff_ns(model, ln) for ln in group.lanes}
    trees = tree_rows(model, group.lanes, until)
    held = forkserver_modules(model, group.launcher) if group.method == "forkserver" and group.launcher else set()
    # modules two ranks or more paid for, except the program's own, what the forkserver holds
    # already, and starttrace's; those whose import ran cuda.init are refused, not picked
    # (grouped by the module's 64-bit hash, then checked by name: a string group-by costs ~5x more)
    paid = (
        trees.filter(pl.col("module").is_not_null() & (pl.col("module") != ""))
        .with_columns(pl.col("module").hash().alias("key"))
        .group_by("key")
        .agg(pl.col("lane").n_unique().alias("ranks"), pl.col("module").first())
        .filter(pl.col("ranks") >= MIN_RANKS)
    )
    paid = _exact_counts(trees, paid).filter(
        ~pl.col("module").is_in(list(excluded | held)) & ~pl.col("module").str.starts_with("starttrace")
    )
    is_tainted = pl.col("module").is_in(list(tainted))
    allowed = paid.filter(~is_tainted)["module"]
    flagged = set(
        trees.filter(is_tainted)
        .group_by("module")
        .agg(pl.col("lane").n_unique().alias("ranks"))
        .filter(pl.col("ranks") >= MIN_RANKS)["module"]
        .to_list()
    )
    refused: dict[str, str] = {}
    if not allowed.len() and not flagged:  # no module two ranks paid for: nothing to pick or refuse
        return Covering([], [], {ln.index: 0 for ln in group.lanes}, {}, {}, refused)
    # from the top of each tree down, the first allowed import (that did not fail) on every branch
    pickable = pl.col("module").is_in(allowed.implode()).fill_null(False) & pl.col("error").is_null()
    under = outermost_map(model, trees, trees.select(pickable).to_series())
    own = under == trees["idx"].to_numpy()
    picks = trees.filter(pl.Series(own))
    # the imports that walk visits: those no pick encloses (the picks themselves among them)
    visited = trees.filter(pl.Series((under < 0) | own))
    for mod in visited.filter(pl.col("module").is_in(list(flagged)))["module"].unique().to_list():
        refused[mod] = _refusal(tainted[mod])
    return _keep(model, group, trees, picks, under, refused, until)


def _exact_counts(trees: pl.DataFrame, paid: pl.DataFrame) -> pl.DataFrame:
    """`paid` (module, ranks: how many lanes imported it), counted again by the names themselves
    for the modules it found (few), so that two names sharing a hash are never counted as one."""
    if not paid.height:
        return paid.select("module", "ranks")
    return (
        trees.filter(
            pl.col("module").is_in(paid["module"].implode()) | pl.col("module").hash().is_in(paid["key"].implode())
        )
        .group_by("module")
        .agg(pl.col("lane").n_unique().alias("ranks"))
        .filter(pl.col("ranks") >= MIN_RANKS)
    )


def _refusal(taint: tuple[Lane, list[str]]) -> str:
    where, chain = taint
    return f"its import ran cuda.init in {where.label} ({' -> '.join(chain)})"


def _keep(
    model: RunModel,
    group: Group,
    trees: pl.DataFrame,
    picks: pl.DataFrame,
    under: Any,
    refused: dict[str, str],
    until: dict[int, int | None],
) -> Covering:
    """Costliest first, keep a module unless a kept one loaded it; then the time each rank spent
    inside the imports the kept list covers."""
    by_mod = picks.group_by("module").agg(pl.col("duration").sum().alias("total"), pl.col("lane").unique().sort())
    total = {mod: t for mod, t, _ in by_mod.iter_rows()}
    ranks_of = {mod: list(lanes) for mod, _, lanes in by_mod.iter_rows()}
    # modules loaded under each pick (itself and every import inside it), per picked module
    loaded = (
        trees.with_columns(pl.Series("pick", under))
        .filter(pl.col("pick") >= 0)
        .join(picks.select(pl.col("idx").alias("pick"), pl.col("module").alias("picked")), on="pick")
        .group_by("picked")
        .agg(pl.col("module").drop_nulls().unique())
    )
    loads = {mod: set(mods) for mod, mods in loaded.iter_rows()}
    n_lanes = len(group.lanes)
    kept: list[str] = []
    small: list[str] = []
    covered: set[str] = set()
    for mod in sorted(total, key=lambda m: (-total[m], m)):
        if mod in covered:
            continue
        if total[mod] / n_lanes / 1e9 < MIN_MODULE_S or len(kept) >= MAX_MODULES:
            small.append(mod)
            continue
        kept.append(mod)
        covered.add(mod)
        covered |= loads.get(mod, set())
    per_lane = {ln.index: 0 for ln in group.lanes}
    if covered:
        found = outermost_rows(model, trees, trees["module"].is_in(list(covered)).fill_null(False))
        per_lane.update(found.group_by("lane").agg(pl.col("duration").sum()).iter_rows())
    return Covering(kept, small, per_lane, ranks_of, total, refused)


def covered_ns(model: RunModel, lane: Lane, covered: set[str], until: int | None = None) -> int:
    """The time inside the outermost imports of `lane` (started before `until`) whose module is in
    `covered`."""
    trees = tree_rows(model, [lane], {lane.index: until})
    found = outermost_rows(model, trees, trees["module"].is_in(list(covered)).fill_null(False))
    return int(found["duration"].sum() or 0)


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
        slack = _idle_before_first_fork(model, group.launcher)
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
    """The fastest completed import of each module anywhere in the run, looked up for the modules a
    group lists (a few dozen) and kept for the next group."""

    def __init__(self, model: RunModel) -> None:
        self.model = model
        self._best: dict[str | None, int] | None = None

    def total(self, modules: list[str]) -> int:
        """The sum of the fastest import of each of `modules`; 2**62 when one never completed."""
        best = self._best
        wanted = [m for m in set(modules) if best is None or m not in best]
        if wanted:
            best = self._best = (best or {}) | dict(
                self.model.spans.filter(
                    (pl.col("phase") == "import")
                    & ~pl.col("in_progress")
                    & pl.col("error").is_null()
                    & pl.col("module").is_in(wanted)
                )
                .group_by("module")
                .agg(pl.col("duration").min())
                .iter_rows()
            )
        best = best or {}
        total = 0
        for mod in set(modules):
            got = best.get(mod)
            if got is None:
                return 1 << 62
            total += got
        return total


def _idle_before_first_fork(model: RunModel, forkserver: Lane) -> int:
    pre = preload_span(model, forkserver)
    forks = [n.start for n in model.select(("fork",), ("process.fork",), lane=forkserver)]
    if pre is None or not forks:
        return 0
    return max(0, min(forks) - pre.eff_end)


def _refused_only(model: RunModel, group: Group, cover: Covering) -> dict[str, Any]:
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
        preloads_now=preload_list(model, group.launcher) if group.method == "forkserver" and group.launcher else [],
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
        now = preload_list(model, fs)
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
        preloads_now=preload_list(model, forkserver) if forkserver else [],
        refused=[{"module": m, "reason": r} for m, r in sorted(cover.refused.items())],
        estimate=est,
    )
