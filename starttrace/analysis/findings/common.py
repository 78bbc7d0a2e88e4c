"""Helpers the findings share: the finding record, lane names, launchers, import trees.

Import trees are table passes (`ImportTree`): per span row, the import that directly encloses it
in its lane (`up_import`), and walks "from the top of each tree down to the first import that
matches" as one vectorised pass (`outermost`) instead of a walk per span."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from typing import Any

import numpy as np
import polars as pl

from starttrace.analysis.model import Lane, RunModel, SpanNode
from starttrace.analysis.phases import merge_intervals
from starttrace.analysis.trees import nearest_marked

SEVERITIES = ("error", "warning", "info")
RANK_ROLES = ("worker", "child")  # roles whose processes are ranks (the EngineCore is not one)
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


def is_forkserver(model: RunModel, lane: Lane) -> bool:
    if lane.role == "forkserver":
        return True
    preloading = getattr(model, "_preloading", None)
    if preloading is None:
        preloading = set(model.matching(("forkserver_preload",))["lane"].to_list())
        model._preloading = preloading  # type: ignore[attr-defined]
    return lane.index in preloading


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


class ImportTree:
    """The run's imports as trees, one pass over the table (cached on the model: `import_tree`).

    Arrays over every row of `model.spans`: `is_import`; `up_import`, the row of the import that
    encloses it most closely in its lane (through spans that are not imports; -1: none, a top
    import); `top`, the outermost import enclosing it or itself (-1 for a span outside any import);
    `rooted`, whether that top counts as a root (completed), and `top_start`, its start."""

    def __init__(self, model: RunModel) -> None:
        self.model = model
        self.is_import = model.array("is_import")
        parent = model.array("parent")
        self.up_import = nearest_marked(parent, self.is_import)  # log(depth) rounds, not one per level
        # rows by their depth in the lane's tree: an enclosing import is always shallower, so one
        # pass over these levels, top down, settles every row (a walk per row costs its depth)
        depth = model.array("depth")
        depth = depth.astype(np.int16 if len(depth) == 0 or depth.max() < 2**15 else np.int32)  # small: a radix sort
        order = np.argsort(depth, kind="stable")
        bounds = np.flatnonzero(np.diff(depth[order])) + 1
        self.levels = np.split(order, bounds) if len(order) else []
        self.top = self.outermost(self.is_import)
        safe = np.maximum(self.top, 0)
        self.rooted = (self.top >= 0) & ~model.array("in_progress")[safe]
        self.top_start = model.array("start")[safe]

    def outermost(self, mark: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Per row (of `rows`, default all): the outermost import among itself and the imports
        enclosing it that `mark` marks; -1 where none is."""
        best = np.full(len(mark) + 1, -1, dtype=np.int64)  # the last slot: "no import" (-1)
        up = self.up_import
        for level in self.levels:
            from_above = best[up[level]]
            best[level] = np.where(from_above >= 0, from_above, np.where(mark[level], level, -1))
        return best[:-1] if rows is None else best[rows.astype(np.int64)]


def import_tree(model: RunModel) -> ImportTree:
    tree = getattr(model, "_import_tree", None)
    if tree is None or tree.model is not model:
        tree = ImportTree(model)
        model._import_tree = tree  # type: ignore[attr-defined]
    return tree


def tree_rows(model: RunModel, lanes: list[Lane], until: dict[int, int | None] | None = None) -> pl.DataFrame:
    """The imports in the trees of the top imports of `lanes` (completed; started before the lane's
    `until` where given), the tops themselves included: idx, lane, module, duration, error, `top`."""
    tree, until, parts = import_tree(model), until or {}, [np.zeros(0, dtype=np.int64)]
    for lane in (model.lanes[i] for i in sorted({ln.index for ln in lanes})):  # each lane: a slice of the table
        rows = slice(lane.offset, lane.offset + lane.count)
        keep = tree.is_import[rows] & tree.rooted[rows]
        if (limit := until.get(lane.index)) is not None:
            keep &= tree.top_start[rows] < limit
        parts.append(np.flatnonzero(keep) + lane.offset)
    chosen = np.concatenate(parts)
    columns = ("idx", "lane", "module", "duration", "error")
    return model.core.select(columns)[chosen].with_columns(pl.Series("top", tree.top[chosen]))


def top_imports(model: RunModel, lanes: list[Lane], until: dict[int, int | None] | None = None) -> pl.DataFrame:
    """The imports of `lanes` that no other import encloses (completed; started before the lane's
    `until` where given): rows."""
    return tree_rows(model, lanes, until).filter(pl.col("top") == pl.col("idx"))


def outermost_map(model: RunModel, rows: pl.DataFrame, mark: pl.Series) -> np.ndarray:
    """Per row of `rows` (imports, from `tree_rows`): the row of the outermost import among itself
    and those enclosing it that `mark` (a bool per row of `rows`) marks; -1: none."""
    full = np.zeros(model.spans.height, dtype=bool)
    full[rows["idx"].to_numpy()] = mark.to_numpy()
    return import_tree(model).outermost(full, rows["idx"].to_numpy())


def outermost_rows(model: RunModel, rows: pl.DataFrame, mark: pl.Series) -> pl.DataFrame:
    """The first import on every branch of the trees `rows` that `mark` marks, walking from the
    top down: the marked rows no marked import encloses."""
    return rows.filter(pl.Series(outermost_map(model, rows, mark) == rows["idx"].to_numpy()))


def preload_list(model: RunModel, lane: Lane) -> list[str]:
    """What a forkserver preloads: its `forkserver.preload` list, else its `preload X` spans."""
    rows = model.lane_rows(lane)
    for n in model.nodes(rows.filter(pl.col("phase") == "forkserver_preload")):
        pre = n.attrs.get("starttrace.preload")
        if isinstance(pre, list):
            return [str(m) for m in pre]
    return [name[8:] for name in rows.filter(pl.col("name").str.starts_with("preload "))["name"].to_list()]


def preload_span(model: RunModel, lane: Lane) -> SpanNode | None:
    outer = model.select(names=("forkserver.preload",), lane=lane)
    if outer:
        return outer[0]
    parts = model.select(("forkserver_preload",), lane=lane)
    return min(parts, key=lambda n: n.depth) if parts else None


def forkserver_modules(model: RunModel, lane: Lane) -> set[str]:
    """Everything a forkserver holds for its children: its preload list, imports, preloaded."""
    out = set(preload_list(model, lane)) | set(lane.preloaded)
    rows = model.lane_rows(lane).filter(pl.col("phase").is_in(["import", "forkserver_preload"]))
    out.update(m for m in rows["module"].drop_nulls().to_list() if m)
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
    # the rows whose attributes hold the file's name at all, then decoded
    holds = model.side.select(
        pl.col("attrs").str.contains(base, literal=True).fill_null(False)
        | pl.col("attrs_pb").bin.contains(base.encode()).fill_null(False)
    ).to_series()
    rows = model.core.select("idx", "phase").filter((pl.col("phase") == "import") & holds.gather(model.spans["src"]))
    for n in model.nodes(rows):
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
    # the earliest first (the chain named for a module is that of its first cuda.init)
    for n in sorted(model.select(("cuda_init",), ("cuda.init",)), key=lambda n: (n.start, n.lane)):
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
