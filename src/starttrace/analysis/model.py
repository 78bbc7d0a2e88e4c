"""The waterfall model: one analysis of a run that every view (JSON, HTML, terminal, metrics,
compare) renders.

Input is a `RunInput` (processes + spans, from the service's store or straight from a journal
directory through `starttrace.reader`). Times are absolute epoch nanoseconds inside the model; the
JSON form uses microseconds relative to the run start (`t0`).

Definitions (also in docs/service.md):
- lane: one process (resource `service.instance.id`, else pid), grouped by role in ROLE_ORDER,
  sorted by rank, then start.
- a span still open is "in progress"; while the run is live its effective end is now, otherwise the
  newest timestamp of the run. `open_s` is how long it has been open.
- phase seconds of a lane: the union of the intervals of its spans with that phase (nested spans of
  one phase are not counted twice; different phases may overlap, e.g. imports inside model_load).
- lane ready: its `ready` span; else, once the run is ready, the end of its last span that ended
  before the run's ready time. Time to ready is measured from the run start (`t0`).
- coverage: share of the lane's window (its `process` span, up to the lane's ready time when
  known) covered by the union of the lane's other spans; what is not covered is listed as gaps.
- critical path: see `critical_path`.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

ROLE_ORDER = {"api_server": 0, "engine_core": 1, "forkserver": 2, "worker": 3, "helper": 4, "main": 5}

NAME_PHASES = {
    "startup": "startup",
    "process": "process",
    "python.init": "interpreter",
    "forkserver.start": "forkserver",
    "forkserver.preload": "forkserver_preload",
    "process.launch": "launch",
    "process.fork": "fork",
    "process.bootstrap": "bootstrap",
    "cuda.init": "cuda_init",
    "dist.init": "dist_init",
    "ready": "ready",
}

# phases whose time is not "work" inside a lane
STRUCTURAL_PHASES = frozenset({"process", "startup"})

GAP_MIN_NS = 1_000_000  # gaps shorter than 1 ms are not listed
MAX_GAPS = 20
TOP_HOTSPOTS = 200


@dataclass
class SpanInput:
    trace_id: str
    span_id: str
    lane_id: str
    parent_id: str | None
    name: str
    start_ns: int
    end_ns: int | None
    in_progress: bool
    instant: bool
    attrs: dict[str, Any]
    error: str | None = None
    thread: int | None = None


@dataclass
class ProcessInput:
    lane_id: str
    pid: int | None
    ppid: int | None
    resource: dict[str, Any]
    exited: bool | None = None
    exit_code: int | None = None
    warnings: list[str] = field(default_factory=list)
    preloaded: list[str] = field(default_factory=list)
    journal_path: str | None = None
    source: str | None = None


@dataclass
class RunInput:
    run_id: str
    trace_id: str | None
    service: str | None
    processes: list[ProcessInput]
    spans: list[SpanInput]
    problems: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    updated_at: float | None = None  # epoch seconds of the newest ingest
    version: int = 0
    source: str | None = None


class SpanNode:
    __slots__ = (
        "attrs",
        "children",
        "depth",
        "eff_end",
        "end",
        "error",
        "id",
        "idx",
        "in_progress",
        "instant",
        "lane",
        "name",
        "parent",
        "parent_node",
        "phase",
        "pos",
        "start",
        "thread",
    )

    def __init__(self) -> None:
        self.children: list[SpanNode] = []
        self.parent_node: SpanNode | None = None
        self.depth = 0
        self.pos = 0

    @property
    def duration(self) -> int:
        return max(0, self.eff_end - self.start)

    @property
    def module(self) -> str | None:
        mod = self.attrs.get("starttrace.import.module")
        if isinstance(mod, str):
            return mod
        if self.name.startswith("import "):
            return self.name[7:]
        return None


@dataclass
class Lane:
    index: int
    id: str
    pid: int | None
    ppid: int | None
    role: str | None
    rank: int | None
    local_rank: int | None
    world_size: int | None
    start_method: str | None
    service: str | None
    host: str | None
    command: str | None
    resource: dict[str, Any]
    exited: bool | None
    exit_code: int | None
    warnings: list[str]
    preloaded: list[str]
    spans: list[SpanNode] = field(default_factory=list)
    process_span: SpanNode | None = None
    start: int = 0
    end: int = 0
    ready_ns: int | None = None
    phases: dict[str, int] = field(default_factory=dict)
    coverage: float | None = None
    gaps: list[tuple[int, int]] = field(default_factory=list)
    unexplained_ns: int = 0
    import_ns: int = 0
    top_imports: list[tuple[str, int]] = field(default_factory=list)
    in_progress: list[SpanNode] = field(default_factory=list)
    launched_by: SpanNode | None = None  # the launch/fork span (in another lane) that made it

    @property
    def label(self) -> str:
        text = self.role or "process"
        if self.rank is not None:
            text += f" rank {self.rank}"
        if self.pid is not None:
            text += f" pid {self.pid}"
        return text


@dataclass
class PathStep:
    lane: int
    name: str
    phase: str
    start: int
    end: int
    kind: str = "span"  # span | launch | gap


@dataclass
class RunModel:
    run_id: str
    trace_id: str | None
    service: str | None
    meta: dict[str, Any]
    problems: list[str]
    t0: int
    t_end: int
    now_ns: int
    status: str  # ready | finished | exited | running
    ready_ns: int | None
    lanes: list[Lane]
    spans: list[SpanNode]
    phases: list[str]
    hotspots: list[dict[str, Any]]
    preload_advice: list[dict[str, Any]]
    cuda_audit: dict[str, Any]
    critical_path: list[PathStep]
    version: int = 0
    updated_at: float | None = None
    source: str | None = None

    @property
    def live(self) -> bool:
        return self.status == "running"

    @property
    def startup_s(self) -> float:
        end = self.ready_ns if self.ready_ns is not None else self.t_end
        return max(0, end - self.t0) / 1e9

    def seconds(self, t: int | None) -> float | None:
        return None if t is None else round((t - self.t0) / 1e9, 6)


# ---------------------------------------------------------------------------------------------
# helpers


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def phase_of(name: str, attrs: dict[str, Any]) -> str:
    phase = attrs.get("starttrace.phase")
    if isinstance(phase, str) and phase:
        return phase
    known = NAME_PHASES.get(name)
    if known:
        return known
    if name.startswith("import "):
        return "import"
    if name.startswith("preload "):
        return "forkserver_preload"
    return "other"


def merge_intervals(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(intervals):
        if e < s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def union_ns(intervals: Iterable[tuple[int, int]]) -> int:
    return sum(e - s for s, e in merge_intervals(intervals))


# ---------------------------------------------------------------------------------------------
# building


def build_model(run: RunInput, now_ns: int | None = None) -> RunModel:
    from starttrace.analysis.advice import cuda_audit, preload_advice

    now = time.time_ns() if now_ns is None else now_ns
    # lanes ---------------------------------------------------------------------------------
    lanes_by_id: dict[str, Lane] = {}
    for p in run.processes:
        res = p.resource or {}
        lanes_by_id[p.lane_id] = Lane(
            index=-1,
            id=p.lane_id,
            pid=p.pid if p.pid is not None else _int(res.get("process.pid")),
            ppid=p.ppid if p.ppid is not None else _int(res.get("process.parent_pid")),
            role=res.get("starttrace.role") if isinstance(res.get("starttrace.role"), str) else None,
            rank=_int(res.get("starttrace.rank")),
            local_rank=_int(res.get("starttrace.local_rank")),
            world_size=_int(res.get("starttrace.world_size")),
            start_method=res.get("starttrace.start_method")
            if isinstance(res.get("starttrace.start_method"), str)
            else None,
            service=res.get("service.name") if isinstance(res.get("service.name"), str) else None,
            host=res.get("host.name") if isinstance(res.get("host.name"), str) else None,
            command=_command(res.get("process.command_args")),
            resource=res,
            exited=p.exited,
            exit_code=p.exit_code,
            warnings=list(p.warnings or []),
            preloaded=list(p.preloaded or []),
        )
    # spans ---------------------------------------------------------------------------------
    nodes: list[SpanNode] = []
    by_id: dict[str, SpanNode] = {}
    t_last = 0
    t_first: int | None = None
    for s in run.spans:
        lane = lanes_by_id.get(s.lane_id)
        if lane is None:
            lane = lanes_by_id[s.lane_id] = Lane(
                index=-1,
                id=s.lane_id,
                pid=None,
                ppid=None,
                role=None,
                rank=None,
                local_rank=None,
                world_size=None,
                start_method=None,
                service=run.service,
                host=None,
                command=None,
                resource={},
                exited=None,
                exit_code=None,
                warnings=[],
                preloaded=[],
            )
        n = SpanNode()
        n.id = s.span_id
        n.parent = s.parent_id
        n.name = s.name
        attrs = s.attrs or {}
        n.attrs = attrs
        n.phase = phase_of(s.name, attrs)
        n.start = s.start_ns
        n.in_progress = bool(s.in_progress) or s.end_ns is None
        n.end = None if n.in_progress else s.end_ns
        n.instant = bool(s.instant) and not n.in_progress
        n.error = s.error
        n.thread = s.thread
        n.lane = lane  # type: ignore[assignment]  # replaced by the lane index below
        by_id[n.id] = n
        nodes.append(n)
        if t_first is None or s.start_ns < t_first:
            t_first = s.start_ns
        last = s.end_ns if s.end_ns is not None else s.start_ns
        if last > t_last:
            t_last = last
    nodes.sort(key=lambda x: x.start)
    # status --------------------------------------------------------------------------------
    # The run is ready when the server answers (`ready`); `process.ready` is one lane's own.
    ready_nodes = [n for n in nodes if n.name == "ready"]
    ready_ns = min((n.start for n in ready_nodes), default=None)
    roots = [n for n in nodes if n.phase == "startup" and n.parent not in by_id]
    all_exited = bool(lanes_by_id) and all(lane.exited for lane in lanes_by_id.values())
    if ready_ns is not None:
        status = "ready"
    elif roots and all(not r.in_progress for r in roots):
        status = "finished"
    elif all_exited:
        status = "exited"
    else:
        status = "running"
    live = status == "running"
    t_eff = max(now, t_last) if live else t_last
    for n in nodes:
        n.eff_end = t_eff if n.in_progress else n.end
        if n.eff_end < n.start:
            n.eff_end = n.start
    # tree ----------------------------------------------------------------------------------
    for n in nodes:
        parent = by_id.get(n.parent) if n.parent else None
        if parent is not None and parent is not n:
            n.parent_node = parent
            if parent.lane is n.lane:
                parent.children.append(n)
    # depth within the lane (iterative, guards cycles)
    for n in nodes:
        depth = 0
        p = n.parent_node
        seen = 0
        while p is not None and p.lane is n.lane and seen < 10_000:
            depth += 1
            p = p.parent_node
            seen += 1
        n.depth = depth
    # lane order ----------------------------------------------------------------------------
    for n in nodes:
        lane_spans = n.lane.spans  # type: ignore[attr-defined]
        n.pos = len(lane_spans)
        lane_spans.append(n)
    for lane in lanes_by_id.values():
        proc = [n for n in lane.spans if n.phase == "process" or n.name == "process"]
        lane.process_span = min(proc, key=lambda n: n.depth) if proc else None
        if lane.process_span is not None:
            lane.start = lane.process_span.start
        elif lane.spans:
            lane.start = lane.spans[0].start
        else:
            lane.start = t_first or 0
    ordered = sorted(
        lanes_by_id.values(),
        key=lambda ln: (ROLE_ORDER.get(ln.role or "", 99), ln.rank is None, ln.rank or 0, ln.start, ln.id),
    )
    for i, lane in enumerate(ordered):
        lane.index = i
    for n in nodes:
        n.lane = n.lane.index  # type: ignore[attr-defined]
    for i, n in enumerate(nodes):
        n.idx = i
    t0_candidates = [n.start for n in roots] or ([t_first] if t_first is not None else [0])
    t0 = min(t0_candidates)
    if t_first is not None:
        t0 = min(t0, t_first)
    # per lane facts ------------------------------------------------------------------------
    for lane in ordered:
        _lane_facts(lane, ready_ns, t_eff)
        if lane.process_span is not None and lane.process_span.parent_node is not None:
            launcher = lane.process_span.parent_node
            if launcher.lane != lane.index:
                lane.launched_by = launcher
    phases_seen: dict[str, None] = {}
    for lane in ordered:
        for ph in lane.phases:
            phases_seen[ph] = None
    model = RunModel(
        run_id=run.run_id,
        trace_id=run.trace_id,
        service=run.service or next((ln.service for ln in ordered if ln.service), None),
        meta=run.meta,
        problems=list(run.problems),
        t0=t0,
        t_end=t_eff if nodes else t0,
        now_ns=now,
        status=status,
        ready_ns=ready_ns,
        lanes=ordered,
        spans=nodes,
        phases=list(phases_seen),
        hotspots=[],
        preload_advice=[],
        cuda_audit={},
        critical_path=[],
        version=run.version,
        updated_at=run.updated_at,
        source=run.source,
    )
    model.hotspots = import_hotspots(model)
    model.preload_advice = preload_advice(model)
    model.cuda_audit = cuda_audit(model)
    model.critical_path = critical_path(model)
    return model


def _command(value: Any) -> str | None:
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    if isinstance(value, str):
        return value
    return None


def _lane_facts(lane: Lane, run_ready: int | None, t_eff: int) -> None:
    spans = lane.spans
    proc = lane.process_span
    work = [n for n in spans if n is not proc and n.phase not in STRUCTURAL_PHASES]
    # ready
    own_ready = [n.start for n in work if n.phase == "ready" or n.name == "ready"]
    if own_ready:
        lane.ready_ns = min(own_ready)
    elif run_ready is not None:
        ends = [n.eff_end for n in work if not n.in_progress and n.eff_end <= run_ready and not n.instant]
        lane.ready_ns = max(ends) if ends else None
    # window
    if proc is not None:
        start = proc.start
        end = proc.eff_end
    else:
        start = min((n.start for n in spans), default=0)
        end = max((n.eff_end for n in spans), default=start)
    if lane.ready_ns is not None and lane.ready_ns >= start:
        end = min(end, lane.ready_ns) if proc is not None and not proc.in_progress else lane.ready_ns
    lane.start, lane.end = start, max(start, end)
    # phases
    by_phase: dict[str, list[tuple[int, int]]] = {}
    for n in work:
        if n.instant:
            continue
        by_phase.setdefault(n.phase, []).append((n.start, n.eff_end))
    lane.phases = {ph: union_ns(iv) for ph, iv in by_phase.items()}
    lane.import_ns = lane.phases.get("import", 0)
    # coverage and gaps
    covered = merge_intervals(
        (max(n.start, lane.start), min(n.eff_end, lane.end)) for n in work if not n.instant and n.eff_end > lane.start
    )
    covered = [(s, e) for s, e in covered if e > s]
    window = lane.end - lane.start
    covered_ns = sum(e - s for s, e in covered)
    lane.coverage = (covered_ns / window) if window > 0 else None
    gaps: list[tuple[int, int]] = []
    cursor = lane.start
    for s, e in covered:
        if s - cursor >= GAP_MIN_NS:
            gaps.append((cursor, s))
        cursor = max(cursor, e)
    if lane.end - cursor >= GAP_MIN_NS:
        gaps.append((cursor, lane.end))
    lane.unexplained_ns = max(0, window - covered_ns)
    gaps.sort(key=lambda g: g[0] - g[1])
    lane.gaps = sorted(gaps[:MAX_GAPS])
    # top imports: top-level imports of the lane (they do not overlap)
    tops = [n for n in work if n.phase == "import" and (n.parent_node is None or n.parent_node.phase != "import")]
    tops.sort(key=lambda n: -n.duration)
    lane.top_imports = [(n.module or n.name, n.duration) for n in tops[:5]]
    lane.in_progress = [n for n in spans if n.in_progress]


def self_ns(n: SpanNode) -> int:
    us = n.attrs.get("starttrace.import.self_us")
    if isinstance(us, (int, float)) and not isinstance(us, bool):
        return int(us * 1000)
    return max(0, n.duration - sum(c.duration for c in n.children))


def rank_slot(lane: Lane) -> tuple[Any, ...]:
    return (lane.role, lane.rank) if lane.rank is not None else ("lane", lane.id)


def import_hotspots(model: RunModel, limit: int = TOP_HOTSPOTS) -> list[dict[str, Any]]:
    acc: dict[str, list[Any]] = {}
    for n in model.spans:
        if n.phase != "import":
            continue
        mod = n.module or n.name
        a = acc.get(mod)
        if a is None:
            a = acc[mod] = [0, 0, set(), set(), 0]
        a[0] += n.duration
        a[1] += self_ns(n)
        lane = model.lanes[n.lane]
        a[2].add(n.lane)
        a[3].add(rank_slot(lane))
        a[4] += 1
    out = [
        {
            "module": mod,
            "cumulative_s": a[0] / 1e9,
            "self_s": a[1] / 1e9,
            "processes": len(a[2]),
            "ranks_paid": len(a[3]),
            "imports": a[4],
        }
        for mod, a in acc.items()
    ]
    out.sort(key=lambda d: (-d["cumulative_s"], d["module"]))
    return out[:limit]


# ---------------------------------------------------------------------------------------------
# critical path


def critical_path(model: RunModel, max_steps: int = 5000) -> list[PathStep]:
    """The chain of spans that ends at the run's `ready` (else at the run's last moment).

    Walking backwards from the target time t in lane L: take the span of L (any depth, not the
    `process` span) that ended last at or before t; if a child process launched while that span
    was open finished its own work just before the span ended (within 5 % / 2 ms), the span was
    waiting for that child: continue in the child's lane instead. At the start of a lane, continue
    in the lane that launched it, before its launch span. Time between chosen spans is a gap.
    """
    if not model.spans:
        return []
    lanes = model.lanes
    per_lane: list[list[SpanNode]] = []
    ends: list[list[int]] = []
    for lane in lanes:
        cand = [
            n
            for n in lane.spans
            if n is not lane.process_span and n.phase not in STRUCTURAL_PHASES and not n.instant and n.duration > 0
        ]
        cand.sort(key=lambda n: (n.eff_end, -n.duration))
        per_lane.append(cand)
        ends.append([n.eff_end for n in cand])
    # who started whom: the launch/fork span that made a lane, and the launch *request* (a
    # `process.launch` with the child's pid, e.g. in the requester of a forkserver child)
    by_pid: dict[int, Lane] = {ln.pid: ln for ln in lanes if ln.pid is not None}
    starter: dict[int, SpanNode] = {}
    for lane in lanes:
        for n in lane.spans:
            child_pid = n.attrs.get("starttrace.child_pid")
            if isinstance(child_pid, int) and n.phase in ("launch", "fork", "forkserver"):
                child = by_pid.get(child_pid)
                if child is None or child.index == lane.index:
                    continue
                prev = starter.get(child.index)
                if prev is None or (prev.phase == "fork" and n.phase == "launch"):
                    starter[child.index] = n
    for lane in lanes:
        if lane.index not in starter and lane.launched_by is not None:
            starter[lane.index] = lane.launched_by
    children_of: dict[int, list[tuple[Lane, SpanNode]]] = {}
    for child_index, span in starter.items():
        children_of.setdefault(span.lane, []).append((lanes[child_index], span))
    if model.ready_ns is not None:
        ready = min(
            (n for n in model.spans if n.start == model.ready_ns and n.name == "ready"),
            key=lambda n: n.idx,
            default=None,
        )
        lane_i = ready.lane if ready is not None else 0
        t = model.ready_ns
    else:
        last = max(model.spans, key=lambda n: n.eff_end)
        lane_i, t = last.lane, last.eff_end
    steps: list[PathStep] = []
    visited_children: set[int] = set()
    for _ in range(max_steps):
        cand, cend = per_lane[lane_i], ends[lane_i]
        k = bisect.bisect_right(cend, t) - 1
        chosen: SpanNode | None = None
        while k >= 0:
            n = cand[k]
            if n.start < t:
                # prefer the widest span among those that end at the same moment
                chosen = n
                j = k - 1
                while j >= 0 and cend[j] == n.eff_end:
                    if cand[j].start < chosen.start:
                        chosen = cand[j]
                    j -= 1
                break
            k -= 1
        if chosen is None:
            lane = lanes[lane_i]
            launcher = starter.get(lane_i)
            if launcher is None or launcher.lane == lane_i:
                break
            child_start = lane.start
            if launcher.start < t:
                end = min(max(child_start, launcher.start), t)
                steps.append(PathStep(launcher.lane, launcher.name, launcher.phase, launcher.start, end, "launch"))
            lane_i, t = launcher.lane, launcher.start
            continue
        waited = _waited_child(chosen, children_of.get(lane_i, []), per_lane, ends, visited_children)
        if waited is not None:
            child, c_end = waited
            visited_children.add(child.index)
            if chosen.eff_end > c_end:
                steps.append(PathStep(lane_i, chosen.name, chosen.phase, c_end, chosen.eff_end, "wait"))
            lane_i, t = child.index, c_end
            continue
        steps.append(PathStep(lane_i, chosen.name, chosen.phase, chosen.start, chosen.eff_end))
        t = chosen.start
    steps.reverse()
    return steps


def _waited_child(
    span: SpanNode,
    children: list[tuple[Lane, SpanNode]],
    per_lane: list[list[SpanNode]],
    ends: list[list[int]],
    visited: set[int],
) -> tuple[Lane, int] | None:
    """The child process `span` was waiting for: launched before `span` ended, and its own work
    ended just before `span` did (within 5 % of the span or 2 ms)."""
    best: tuple[Lane, int] | None = None
    slack = max(2_000_000, (span.eff_end - span.start) // 20)
    own_child = span.attrs.get("starttrace.child_pid")
    for child, launch in children:
        if child.index in visited or launch.start > span.eff_end:
            continue
        if isinstance(own_child, int) and child.pid != own_child:
            continue  # a launch span waits for its own child only
        cend = ends[child.index]
        k = bisect.bisect_right(cend, span.eff_end) - 1
        if k < 0:
            continue
        c_end = cend[k]
        if c_end >= span.eff_end - slack and c_end > span.start and (best is None or c_end > best[1]):
            best = (child, c_end)
    return best


# ---------------------------------------------------------------------------------------------
# JSON view

SPAN_FIELDS = ["id", "parent", "name", "phase", "start_us", "end_us", "depth", "flags", "attrs"]
FLAG_IN_PROGRESS, FLAG_INSTANT, FLAG_ERROR = 1, 2, 4
_HIDDEN_ATTRS = ("starttrace.phase", "starttrace.in_progress")


def _us(t: int, t0: int) -> int:
    return (t - t0) // 1000


def to_json(model: RunModel, include_spans: bool = True) -> dict[str, Any]:
    t0 = model.t0
    s = model.seconds
    lanes_out = []
    for lane in model.lanes:
        entry: dict[str, Any] = {
            "index": lane.index,
            "id": lane.id,
            "label": lane.label,
            "role": lane.role,
            "rank": lane.rank,
            "local_rank": lane.local_rank,
            "world_size": lane.world_size,
            "pid": lane.pid,
            "ppid": lane.ppid,
            "start_method": lane.start_method,
            "service": lane.service,
            "host": lane.host,
            "command": lane.command,
            "exited": lane.exited,
            "exit_code": lane.exit_code,
            "warnings": lane.warnings,
            "start_s": s(lane.start),
            "end_s": s(lane.end),
            "time_to_ready_s": s(lane.ready_ns),
            "ready_since_start_s": None if lane.ready_ns is None else round((lane.ready_ns - lane.start) / 1e9, 6),
            "phases": {ph: round(ns / 1e9, 6) for ph, ns in lane.phases.items()},
            "import_s": round(lane.import_ns / 1e9, 6),
            "top_imports": [{"module": m, "seconds": round(d / 1e9, 6)} for m, d in lane.top_imports],
            "coverage": None if lane.coverage is None else round(lane.coverage, 4),
            "unexplained_s": round(lane.unexplained_ns / 1e9, 6),
            "gaps": [{"start_s": s(a), "end_s": s(b), "seconds": round((b - a) / 1e9, 6)} for a, b in lane.gaps],
            "in_progress": [_open_span(n, model) for n in lane.in_progress],
            "launched_by": None
            if lane.launched_by is None
            else {"lane": lane.launched_by.lane, "span": lane.launched_by.id, "name": lane.launched_by.name},
            "span_count": len(lane.spans),
        }
        if include_spans:
            entry["spans"] = [_span_row(n, t0) for n in lane.spans]
        lanes_out.append(entry)
    in_progress = [
        dict(_open_span(n, model), lane=n.lane, label=model.lanes[n.lane].label)
        for lane in model.lanes
        for n in lane.in_progress
        if n is not lane.process_span and n.phase not in STRUCTURAL_PHASES
    ]
    in_progress.sort(key=lambda d: -d["open_s"])
    return {
        "run_id": model.run_id,
        "trace_id": model.trace_id,
        "service": model.service,
        "source": model.source,
        "status": model.status,
        "live": model.live,
        "version": model.version,
        "start_ns": t0,
        "now_ns": model.now_ns,
        "duration_s": round((model.t_end - t0) / 1e9, 6),
        "startup_s": round(model.startup_s, 6),
        "ready_s": s(model.ready_ns),
        "phases": model.phases,
        "problems": model.problems,
        "meta": model.meta,
        "span_fields": SPAN_FIELDS,
        "lanes": lanes_out,
        "ranks": rank_table(model),
        "in_progress": in_progress[:200],
        "critical_path": [
            {
                "lane": st.lane,
                "label": model.lanes[st.lane].label,
                "name": st.name,
                "phase": st.phase,
                "kind": st.kind,
                "start_s": s(st.start),
                "end_s": s(st.end),
                "seconds": round((st.end - st.start) / 1e9, 6),
            }
            for st in model.critical_path
        ],
        "import_hotspots": model.hotspots[:100],
        "preload_advice": model.preload_advice,
        "cuda_audit": model.cuda_audit,
    }


def rank_table(model: RunModel) -> list[dict[str, Any]]:
    out = []
    for lane in model.lanes:
        out.append(
            {
                "lane": lane.index,
                "label": lane.label,
                "role": lane.role,
                "rank": lane.rank,
                "pid": lane.pid,
                "time_to_ready_s": model.seconds(lane.ready_ns),
                "phases": {ph: round(ns / 1e9, 6) for ph, ns in lane.phases.items()},
                "coverage": None if lane.coverage is None else round(lane.coverage, 4),
            }
        )
    return out


def _open_span(n: SpanNode, model: RunModel) -> dict[str, Any]:
    return {
        "id": n.id,
        "name": n.name,
        "phase": n.phase,
        "start_s": model.seconds(n.start),
        "open_s": round((n.eff_end - n.start) / 1e9, 6),
    }


def _span_row(n: SpanNode, t0: int) -> list[Any]:
    flags = (
        (FLAG_IN_PROGRESS if n.in_progress else 0) | (FLAG_INSTANT if n.instant else 0) | (FLAG_ERROR if n.error else 0)
    )
    extra: dict[str, Any] | None = None
    if n.attrs or n.error:
        extra = {k: v for k, v in n.attrs.items() if k not in _HIDDEN_ATTRS}
        if n.phase == "import" and extra.get("starttrace.import.module") == n.name[7:]:
            del extra["starttrace.import.module"]
        if n.error:
            extra["error"] = n.error
        if not extra:
            extra = None
    p = n.parent_node
    parent = p.pos if p is not None and p.lane == n.lane else -1
    return [
        n.id,
        parent,
        n.name,
        n.phase,
        _us(n.start, t0),
        None if n.in_progress else _us(n.eff_end, t0),
        n.depth,
        flags,
        extra,
    ]


# ---------------------------------------------------------------------------------------------
# inputs


def run_input_from_rows(rows: Any) -> RunInput:
    """From `starttrace.service.store.RunRows`. A span's `attrs` is JSON object text, or the span's
    raw OTLP protobuf bytes (OTLP ingest; decoded here)."""
    from starttrace.service.store import decode_attrs

    spans = [
        SpanInput(
            trace_id=r[0],
            span_id=r[1],
            lane_id=r[2],
            parent_id=r[3],
            name=r[4],
            start_ns=r[5],
            end_ns=None if (r[7] and r[6] is None) else r[6],
            in_progress=bool(r[7]),
            instant=bool(r[8]),
            attrs=decode_attrs(r[9]),
            error=r[10],
            thread=r[11],
        )
        for r in rows.spans
    ]
    procs = [
        ProcessInput(
            lane_id=p["lane_id"],
            pid=p["pid"],
            ppid=p["ppid"],
            resource=p["resource"],
            exited=None if p["exited"] is None else bool(p["exited"]),
            exit_code=p["exit_code"],
            warnings=p["warnings"],
            preloaded=p["preloaded"],
            journal_path=p["journal_path"],
            source=p["source"],
        )
        for p in rows.processes
    ]
    return RunInput(
        run_id=rows.run_id,
        trace_id=rows.trace_id,
        service=rows.service,
        processes=procs,
        spans=spans,
        problems=rows.problems,
        meta=rows.meta,
        updated_at=rows.updated_at,
        version=rows.version,
        source=rows.source,
    )


def run_input_from_reader(run: Any) -> RunInput:
    """From `starttrace.reader.Run` (a journal directory read directly, e.g. `starttrace report`)."""
    procs: list[ProcessInput] = []
    spans: list[SpanInput] = []
    trace_id = run.trace_id

    def span_input(sp: Any, lane_id: str) -> SpanInput:
        return SpanInput(
            trace_id=trace_id,
            span_id=sp.span_id,
            lane_id=lane_id,
            parent_id=sp.parent_id,
            name=sp.name,
            start_ns=sp.start_ns,
            end_ns=sp.end_ns,
            in_progress=sp.end_ns is None,
            instant=bool(sp.instant),
            attrs=dict(sp.attrs or {}),
            error=sp.error,
            thread=sp.thread,
        )
    for p in run.processes:
        procs.append(
            ProcessInput(
                lane_id=p.instance_id,
                pid=p.pid,
                ppid=p.ppid,
                resource=dict(p.resource),
                exited=p.exited,
                exit_code=p.exit_code,
                warnings=list(p.warnings),
                preloaded=list(p.preloaded),
                journal_path=str(p.journal_path),
                source="journal",
            )
        )
        spans.extend(span_input(sp, p.instance_id) for sp in p.spans)
    if run.processes:
        roots = [p for p in run.processes if p.resource.get("starttrace.start_method") == "root"]
        root_lane = (roots or run.processes)[0].instance_id
        spans.extend(span_input(sp, root_lane) for sp in getattr(run, "root_spans", []) or [])
    service = (run.meta or {}).get("service") if isinstance(run.meta, dict) else None
    return RunInput(
        run_id=run.run_id,
        trace_id=trace_id,
        service=service,
        processes=procs,
        spans=spans,
        problems=list(run.problems),
        meta=dict(run.meta or {}),
        source="journal",
    )
