"""JSON view of the waterfall model (`GET /startup`, `starttrace report --json`).

Times are seconds (or microseconds for span rows) relative to the run start `t0`."""

from __future__ import annotations

from typing import Any

from starttrace.analysis.critical_path import path_by_lane, path_phases
from starttrace.analysis.model import STRUCTURAL_PHASES, Lane, RunModel, SpanNode
from starttrace.analysis.nodes import node_rows

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
        entry = _lane_json(model, lane)
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
        "critical_path": _path_json(model),
        # the run's time to ready by phase: the critical path's steps, by their lanes' exclusive timelines
        "ready_by_phase": {label: round(ns / 1e9, 6) for label, ns in path_phases(model).items()},
        "critical_path_by_lane": [
            {"lane": lane, "label": model.lanes[lane].label, "seconds": round(ns / 1e9, 6)}
            for lane, ns in path_by_lane(model.critical_path)
        ],
        "import_hotspots": model.hotspots[:100],
        "preload_advice": model.preload_advice,
        "cuda_audit": model.cuda_audit,
        "nodes": node_rows(model),  # several hosts: host, clock offset and error per node (docs/multinode.md)
        "findings": model.findings,  # docs/findings.md; preload_advice and cuda_audit are their older forms
    }


def _lane_json(model: RunModel, lane: Lane) -> dict[str, Any]:
    s = model.seconds
    return {
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
        "node": lane.node,
        "command": lane.command,
        "exited": lane.exited,
        "exit_code": lane.exit_code,
        "warnings": lane.warnings,
        "start_s": s(lane.start),
        "end_s": s(lane.end),
        "time_to_ready_s": s(lane.ready_ns),
        "ready_since_start_s": None if lane.ready_ns is None else round((lane.ready_ns - lane.start) / 1e9, 6),
        "phases": {ph: round(ns / 1e9, 6) for ph, ns in lane.phases.items()},
        # exclusive: each instant of [start_s, end_s] to the innermost span's phase; adds up to end_s - start_s
        "breakdown": {label: round(ns / 1e9, 6) for label, ns in lane.breakdown.items()},
        "after_ready": lane.after_ready,
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


def _path_json(model: RunModel) -> list[dict[str, Any]]:
    s = model.seconds
    return [
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
    ]


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
                "breakdown": {label: round(ns / 1e9, 6) for label, ns in lane.breakdown.items()},
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
