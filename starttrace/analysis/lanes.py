"""Build the waterfall model from a run: lanes (one per process), span trees, per-lane facts."""

from __future__ import annotations

import heapq
import operator
import time
from typing import Any

from starttrace import run as run_type
from starttrace.analysis.breakdown import set_breakdowns
from starttrace.analysis.critical_path import critical_path
from starttrace.analysis.duplicates import without_vllm_copies
from starttrace.analysis.findings import cuda_audit, find_all, preload_advice_rows
from starttrace.analysis.liveness import dead_lanes, end_open_spans, ended_status
from starttrace.analysis.model import (
    GAP_MIN_NS,
    MAX_GAPS,
    NAME_PHASES,
    ROLE_ORDER,
    STRUCTURAL_PHASES,
    TOP_HOTSPOTS,
    Lane,
    RunModel,
    SpanNode,
    rank_slot,
    select,
    self_ns,
)
from starttrace.analysis.nodes import node_key, node_names, node_order
from starttrace.analysis.phases import merge_intervals, phase_by_name, union_ns
from starttrace.run import HOT_KEYS, Process, Run, Span, gc_paused, hot_values, int_or_none

try:  # the per-span loops in C (starttrace/_modelcore.c, built at install where a C compiler is there)
    from starttrace import _modelcore  # type: ignore[attr-defined]

    c_span_nodes, c_link_tree = _modelcore.span_nodes, _modelcore.link_tree
    c_set_durations = _modelcore.set_durations
    c_phase_intervals, c_hotspot_top = _modelcore.phase_intervals, _modelcore.hotspot_top
    c_lane_positions, c_lane_indexes = _modelcore.lane_positions, _modelcore.lane_indexes
    c_last_time = _modelcore.last_time
except ImportError:
    c_span_nodes = c_link_tree = c_set_durations = c_phase_intervals = c_hotspot_top = None
    c_lane_positions = c_lane_indexes = c_last_time = None

_START = operator.attrgetter("start")


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def build_model(run: Run, now_ns: int | None = None, stall_s: float | None = None) -> RunModel:
    """The waterfall model of `run`; `now_ns` (default: now) is the effective end of open spans
    while the run is live; `stall_s` (default: STARTTRACE_STALL_S, else 60) when a span that is
    still open makes a `stalled` finding."""
    with gc_paused():
        return _build(run, now_ns, stall_s)


def _build(run: Run, now_ns: int | None, stall_s: float | None = None) -> RunModel:
    now = time.time_ns() if now_ns is None else now_ns
    run = without_vllm_copies(run)  # vLLM's own OTLP copies of marks the journal holds
    lanes_by_id = {p.instance_id: _lane_of(p, run.service) for p in run.processes}
    nodes, by_id = _span_nodes(run, lanes_by_id)
    # nodes are sorted by start: the first match is the earliest
    ready_ns = next((n.start for n in select(nodes, (), ("ready",))), None)
    roots = [n for n in select(nodes, ("startup",)) if n.parent not in by_id]
    dead = dead_lanes(run, lanes_by_id)  # liveness from evidence (analysis/liveness.py)
    status = _status(ready_ns, roots, list(lanes_by_id.values()))
    if dead:
        status = (ended_status(why for _, why in dead.values()) or status) if status == "exited" else status
        end_open_spans(dead, nodes)
    t_first = nodes[0].start if nodes else None
    t_last = _last_time(nodes)
    t_eff = max(now, t_last) if status == "running" else t_last
    _set_durations(nodes, t_eff)
    _link_tree(nodes, by_id)
    ordered = _order_lanes(nodes, lanes_by_id, t_first)
    t0 = min([n.start for n in roots] + ([t_first] if t_first is not None else [0]))
    for lane in ordered:
        _lane_facts(lane, ready_ns, t_eff)
        if lane.process_span is not None and lane.process_span.parent_node is not None:
            launcher = lane.process_span.parent_node
            if launcher.lane != lane.index:
                lane.launched_by = launcher
    model = RunModel(
        run_id=run.run_id,
        trace_id=run.trace_id or None,
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
        phases=list(dict.fromkeys(ph for lane in ordered for ph in lane.phases)),
        hotspots=[],
        preload_advice=[],
        cuda_audit={},
        critical_path=[],
        version=run.version,
        updated_at=run.updated_at,
        source=run.source,
    )
    set_breakdowns(model)
    model.hotspots = import_hotspots(model)
    model.cuda_audit = cuda_audit(model)
    model.critical_path = critical_path(model)
    model.findings = find_all(model, stall_s)
    model.preload_advice = preload_advice_rows(model.findings)
    return model


def _last_time(nodes: list[SpanNode]) -> int:
    """The latest end of the nodes (a start where a node has none yet); 0 for none."""
    if c_last_time is not None:
        last = c_last_time(nodes, SpanNode)
        if last is not None:  # None: a time beyond 64 bits, done here on Python ints
            return last  # type: ignore[no-any-return]
    return max([n.start if n.end is None else n.end for n in nodes], default=0)


def _set_durations(nodes: list[SpanNode], t_eff: int) -> None:
    """Each node's effective end (`t_eff` while in progress) and duration (never negative)."""
    if c_set_durations is not None:
        c_set_durations(nodes, SpanNode, t_eff)
        return
    for n in nodes:
        start = n.start
        end = t_eff if n.in_progress else n.end
        if end > start:
            n.eff_end, n.duration = end, end - start
        else:
            n.eff_end, n.duration = start, 0


def _lane_of(p: Process, service: str | None) -> Lane:
    res = p.resource or {}
    return Lane(
        index=-1,
        id=p.instance_id,
        pid=p.pid if p.pid else int_or_none(res.get("process.pid")),
        ppid=p.ppid if p.ppid else int_or_none(res.get("process.parent_pid")),
        role=_str(res.get("starttrace.role")) or None,
        rank=int_or_none(res.get("starttrace.rank")),
        local_rank=int_or_none(res.get("starttrace.local_rank")),
        world_size=int_or_none(res.get("starttrace.world_size")),
        start_method=_str(res.get("starttrace.start_method")),
        service=_str(res.get("service.name")) or service,
        host=_str(res.get("host.name")),
        command=_command(res.get("process.command_args")),
        resource=res,
        exited=p.exited,
        exit_code=p.exit_code,
        warnings=list(p.warnings or []),
        preloaded=list(p.preloaded or []),
    )


def _span_nodes(run: Run, lanes_by_id: dict[str, Lane]) -> tuple[list[SpanNode], dict[str, SpanNode]]:
    """One node per span, on its process's lane; the run's root spans go to the root process."""
    nodes: list[SpanNode] = []
    by_id: dict[str, SpanNode] = {}
    groups: list[tuple[Lane, list[Span]]] = []
    for s in run.root_spans:  # one root per node
        owner = run.root_owner(s)
        if owner is not None:
            groups.append((lanes_by_id[owner.instance_id], [s]))
    groups.extend((lanes_by_id[p.instance_id], p.spans) for p in run.processes)
    if c_span_nodes is not None:  # the same loop, ~12,000 instructions per span cheaper
        raw_reader = run_type.RAW_HOT_READER
        nodes, by_id, in_order = c_span_nodes(
            [(lane, spans if type(spans) is list else list(spans)) for lane, spans in groups],
            SpanNode,
            Span,
            HOT_KEYS,
            NAME_PHASES,
            hot_values,
            *(raw_reader or (None, None, None, None)),
        )
        if not in_order:  # sorted by start in C, unless a start is not a plain int64
            nodes.sort(key=_START)
        return nodes, by_id
    append = nodes.append
    for lane, spans in groups:
        for s in spans:
            n = SpanNode()
            n.id = sid = s.span_id
            n.parent = s.parent_id
            n.name = name = s.name
            n.attrs = attrs = s.attrs if s.attrs is not None else {}  # not `or`: keeps lazily decoded attrs undecoded
            phase, mod, self_us = hot_values(attrs)
            n.phase = phase if type(phase) is str and phase else phase_by_name(name)
            if not isinstance(mod, str):
                mod = name[7:] if name.startswith("import ") else None
            n.module = mod
            if isinstance(self_us, (int, float)) and not isinstance(self_us, bool):
                n.self_us = self_us
            n.start = s.start_ns
            n.in_progress = is_open = s.in_progress or s.end_ns is None
            n.end = None if is_open else s.end_ns
            n.instant = bool(s.instant) and not is_open
            n.error = s.error
            n.thread = s.thread
            n.lane = lane  # type: ignore[assignment]  # the lane index, once ordered
            by_id[sid] = n
            append(n)
    nodes.sort(key=_START)
    return nodes, by_id


def _status(ready_ns: int | None, roots: list[SpanNode], lanes: list[Lane]) -> str:
    """ready: the server answers (`ready`; a lane's own `process.ready` is not the run's);
    finished: the startup span ended; exited: every process exited; else running."""
    if ready_ns is not None:
        return "ready"
    if roots and all(not r.in_progress for r in roots):
        return "finished"
    if lanes and all(lane.exited for lane in lanes):
        return "exited"
    return "running"


def _link_tree(nodes: list[SpanNode], by_id: dict[str, SpanNode]) -> None:
    """Parents and children (children only within a lane), and each node's depth in its lane."""
    if c_link_tree is not None:
        c_link_tree(nodes, by_id, SpanNode)
        return
    for n in nodes:
        parent = by_id.get(n.parent) if n.parent else None
        if parent is not None and parent is not n:
            n.parent_node = parent
            if parent.lane is n.lane:
                if parent.children is SpanNode.NO_CHILDREN:
                    parent.children = [n]
                else:
                    parent.children.append(n)
    for n in nodes:
        depth = 0
        p = n.parent_node
        while p is not None and p.lane is n.lane and depth < 10_000:  # bounded: guards cycles
            depth += 1
            p = p.parent_node
        n.depth = depth


def _order_lanes(nodes: list[SpanNode], lanes_by_id: dict[str, Lane], t_first: int | None) -> list[Lane]:
    """Lanes by role, rank and start; nodes get their lane index, position in the lane and index."""
    if c_lane_positions is not None:
        c_lane_positions(nodes, SpanNode)
    else:
        for n in nodes:
            lane_spans = n.lane.spans  # type: ignore[attr-defined]
            n.pos = len(lane_spans)
            lane_spans.append(n)
    for lane in lanes_by_id.values():
        proc = select(lane.spans, ("process",), ("process",))
        lane.process_span = min(proc, key=lambda n: n.depth) if proc else None
        if lane.process_span is not None:
            lane.start = lane.process_span.start
        elif lane.spans:
            lane.start = lane.spans[0].start
        else:
            lane.start = t_first or 0
    hosts = node_order(list(lanes_by_id.values()))  # several hosts: lanes by node, then role and rank
    if len(hosts) > 1:
        names = node_names(hosts)
        for lane in lanes_by_id.values():
            lane.node = names[node_key(lane)]
    ordered = sorted(
        lanes_by_id.values(),
        key=lambda ln: (
            hosts[node_key(ln)],
            ROLE_ORDER.get(ln.role or "", 99),
            ln.rank is None,
            ln.rank or 0,
            ln.start,
            ln.id,
        ),
    )
    for i, lane in enumerate(ordered):
        lane.index = i
    if c_lane_indexes is not None:
        c_lane_indexes(nodes, SpanNode)
        return ordered
    for i, n in enumerate(nodes):
        n.lane = n.lane.index  # type: ignore[attr-defined]
        n.idx = i
    return ordered


def _command(value: Any) -> str | None:
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    if isinstance(value, str):
        return value
    return None


def _lane_facts(lane: Lane, run_ready: int | None, t_eff: int) -> None:
    spans = lane.spans
    proc = lane.process_span
    work = select(spans, STRUCTURAL_PHASES, keep=False)
    if proc is not None and proc.phase not in STRUCTURAL_PHASES:
        work.remove(proc)  # by identity: span nodes have no __eq__
    # ready
    own_ready = [n.start for n in select(work, ("ready",), ("ready",))]
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
    lane.phases, covered = _phase_intervals(work, lane.start, lane.end)
    lane.import_ns = lane.phases.get("import", 0)
    # coverage and gaps
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
    tops = [n for n in select(work, ("import",)) if n.parent_node is None or n.parent_node.phase != "import"]
    tops.sort(key=lambda n: -n.duration)
    lane.top_imports = [(n.module or n.name, n.duration) for n in tops[:5]]
    lane.in_progress = [n for n in spans if n.in_progress]


def _phase_intervals(work: list[SpanNode], low: int, high: int) -> tuple[dict[str, int], list[tuple[int, int]]]:
    """Phase seconds (ns) of the work spans (instants left out), and the union of their intervals
    clipped to the window [low, high] (empty ones dropped)."""
    if c_phase_intervals is not None:
        done = c_phase_intervals(work, SpanNode, low, high)
        if done is not None:  # None: a time beyond 64 bits, done here on Python ints
            return done  # type: ignore[no-any-return]
    by_phase: dict[str, list[tuple[int, int]]] = {}
    clipped: list[tuple[int, int]] = []
    for n in work:  # one loop: it runs for every span
        if n.instant:
            continue
        s, e = n.start, n.eff_end
        intervals = by_phase.get(n.phase)
        if intervals is None:
            by_phase[n.phase] = [(s, e)]
        else:
            intervals.append((s, e))
        if e > low:
            clipped.append((s if s > low else low, e if e < high else high))
    phases = {ph: union_ns(iv) for ph, iv in by_phase.items()}
    return phases, [(s, e) for s, e in merge_intervals(clipped) if e > s]


def import_hotspots(model: RunModel, limit: int = TOP_HOTSPOTS) -> list[dict[str, Any]]:
    # C sums in C integers and makes rows only for the modules it keeps (None: a value it does
    # not take; the sums below then do it)
    top = None if c_hotspot_top is None else c_hotspot_top(model.spans, SpanNode, "import", limit, len(model.lanes))
    if top is None:
        acc = _hotspot_sums(model.spans)
        # the top `limit` picked before any row is built: a run has thousands of distinct modules.
        # Every module at least as long as the limit-th longest, ordered: the same first `limit` as
        # ordering all of them (names are unique), with no key call per module.
        top = list(acc.items())
        if len(top) > limit > 0:
            cut = heapq.nlargest(limit, [a[0] for a in acc.values()])[-1]
            top = [item for item in top if item[1][0] >= cut]
    top.sort(key=_hotspot_order)
    top = top[:limit] if limit > 0 else []
    slots = [rank_slot(lane) for lane in model.lanes]
    return [
        {
            "module": mod,
            "cumulative_s": a[0] / 1e9,
            "self_s": a[1] / 1e9,
            "processes": len(a[2]),
            "ranks_paid": len({slots[i] for i in a[2]}),
            "imports": a[3],
        }
        for mod, a in top
    ]


def _hotspot_sums(nodes: list[SpanNode]) -> dict[str, list[Any]]:
    """Per module of the import spans: [cumulative ns, self ns, lane indices, imports] (where
    `_modelcore.hotspot_top` does not take a value: the reference it is tested against)."""
    acc: dict[str, list[Any]] = {}
    get = acc.get
    for n in nodes:
        if n.phase != "import":
            continue
        mod = n.module or n.name
        a = get(mod)
        if a is None:
            a = acc[mod] = [0, 0, set(), 0]
        a[0] += n.duration
        a[1] += self_ns(n)
        a[2].add(n.lane)
        a[3] += 1
    return acc


def _hotspot_order(item: tuple[str, list[Any]]) -> tuple[int, str]:
    return -item[1][0], item[0]  # longest cumulative time first, then by name
