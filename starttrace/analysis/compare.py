"""Run A vs run B: per phase (each process's exclusive breakdown, and time to ready along the
critical path), per rank, per module, and the findings' predicted savings against the realised."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from starttrace.analysis.critical_path import path_phases
from starttrace.analysis.findings.common import is_forkserver, preload_list
from starttrace.analysis.findings.preload import covered_ns
from starttrace.analysis.model import Lane, RunModel
from starttrace.analysis.nodes import compare_nodes, lane_keys
from starttrace.analysis.plan import plan_check

MAX_MODULES = 100


@dataclass
class Comparison:
    a: str
    b: str
    summary: dict[str, Any]
    phases: list[dict[str, Any]]
    ranks: list[dict[str, Any]]
    modules: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    preload_checks: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)  # per node, runs of several hosts (analysis/nodes.py)
    ready_by_phase: list[dict[str, Any]] = field(default_factory=list)  # time to ready by phase (critical path)
    compile_checks: list[dict[str, Any]] = field(default_factory=list)  # cold_compile: predicted vs realised
    # why time to ready changed, ranked (analysis/causes.py): [{key, from, to, seconds}], the rest unexplained
    causes: list[dict[str, Any]] = field(default_factory=list)
    unexplained_s: float | None = None
    start_kinds: dict[str, Any] = field(default_factory=dict)  # {"a": kind, "b": kind, "fingerprint": {a, b}}
    plan: dict[str, Any] = field(default_factory=dict)  # A's plan against B (analysis.plan.plan_check)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _delta(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    return round(b - a, 6)


def compare(a: RunModel, b: RunModel) -> Comparison:
    summary = _summary(a, b)
    notes = []
    if summary["start_methods"]["a"] != summary["start_methods"]["b"]:
        notes.append(
            f"start methods differ: {', '.join(summary['start_methods']['a']) or '-'} vs "
            f"{', '.join(summary['start_methods']['b']) or '-'}"
        )
    return Comparison(
        a=a.run_id,
        b=b.run_id,
        summary=summary,
        phases=_deltas(_phase_totals(a), _phase_totals(b)),
        ranks=_ranks(a, b),
        modules=_modules(a, b)[:MAX_MODULES],
        notes=notes,
        preload_checks=preload_checks(a, b),
        nodes=compare_nodes(a, b),
        ready_by_phase=_deltas(path_phases(a), path_phases(b)),
        compile_checks=compile_checks(a, b),
        **_causes(a, b),
        plan=plan_check(a, b),
    )


def _causes(a: RunModel, b: RunModel) -> dict[str, Any]:
    from starttrace.analysis.causes import causes

    found = causes(a, b)
    return {
        "causes": found["causes"],
        "unexplained_s": found["unexplained_s"],
        "start_kinds": {**found["kind"], "fingerprint": found["fingerprint"]},
    }


def _summary(a: RunModel, b: RunModel) -> dict[str, Any]:
    return {
        "startup_s": _pair(a.startup_s, b.startup_s),
        "time_to_first_token_s": _pair(a.time_to_first_token_s, b.time_to_first_token_s),
        "until": a.until,  # where both models' breakdowns and critical paths end (`--until`)
        "processes": {"a": len(a.lanes), "b": len(b.lanes), "delta": len(b.lanes) - len(a.lanes)},
        "spans": {"a": a.spans.height, "b": b.spans.height, "delta": b.spans.height - a.spans.height},
        "status": {"a": a.status, "b": b.status},
        "start_methods": {
            "a": sorted({ln.start_method for ln in a.lanes if ln.start_method}),
            "b": sorted({ln.start_method for ln in b.lanes if ln.start_method}),
        },
    }


def _phase_totals(m: RunModel) -> dict[str, int]:
    """Ns per part of the processes' exclusive breakdowns, summed over the lanes."""
    tot: dict[str, int] = defaultdict(int)
    for lane in m.lanes:
        for label, ns in lane.breakdown.items():
            tot[label] += ns
    return tot


def _deltas(pa: dict[str, int], pb: dict[str, int]) -> list[dict[str, Any]]:
    """Per label: A's and B's seconds and B - A, the largest change first."""
    rows = [
        {
            "phase": ph,
            "a": round(pa.get(ph, 0) / 1e9, 6),
            "b": round(pb.get(ph, 0) / 1e9, 6),
            "delta": round((pb.get(ph, 0) - pa.get(ph, 0)) / 1e9, 6),
        }
        for ph in dict.fromkeys(list(pa) + list(pb))
    ]
    rows.sort(key=lambda d: -abs(d["delta"]))
    return rows


def _pair(x: float | None, y: float | None) -> dict[str, float | None]:
    return {
        "a": None if x is None else round(x, 6),
        "b": None if y is None else round(y, 6),
        "delta": _delta(x, y),
    }


def _ranks(a: RunModel, b: RunModel) -> list[dict[str, Any]]:
    """Lanes matched by role and rank (else role and order), side by side."""
    ka, kb = lane_keys(a), lane_keys(b)
    ranks = []
    for key in dict.fromkeys([*ka, *kb]):
        la, lb = ka.get(key), kb.get(key)
        ta = a.seconds(la.ready_ns) if la is not None else None
        tb = b.seconds(lb.ready_ns) if lb is not None else None
        da = la.breakdown if la else {}
        db = lb.breakdown if lb else {}
        phases = {}
        for ph in dict.fromkeys(list(da) + list(db)):
            entry = _pair(da.get(ph, 0) / 1e9 if la else None, db.get(ph, 0) / 1e9 if lb else None)
            entry["a"] = round(da[ph] / 1e9, 6) if ph in da else None
            entry["b"] = round(db[ph] / 1e9, 6) if ph in db else None
            phases[ph] = entry
        ranks.append(
            {
                "key": key,
                "pid_a": la.pid if la else None,
                "pid_b": lb.pid if lb else None,
                "time_to_ready_s": {"a": ta, "b": tb, "delta": _delta(ta, tb)},
                "import_s": _pair(la.import_ns / 1e9 if la else None, lb.import_ns / 1e9 if lb else None),
                "phases": phases,
            }
        )
    return ranks


def _modules(a: RunModel, b: RunModel) -> list[dict[str, Any]]:
    ma = {h["module"]: h for h in a.hotspots}
    mb = {h["module"]: h for h in b.hotspots}
    modules = []
    for mod in set(ma) | set(mb):
        ha, hb = ma.get(mod), mb.get(mod)
        ca = ha["cumulative_s"] if ha else 0.0
        cb = hb["cumulative_s"] if hb else 0.0
        modules.append(
            {
                "module": mod,
                "a": round(ca, 6),
                "b": round(cb, 6),
                "delta": round(cb - ca, 6),
                "ranks_paid_a": ha["ranks_paid"] if ha else 0,
                "ranks_paid_b": hb["ranks_paid"] if hb else 0,
            }
        )
    modules.sort(key=lambda d: (-abs(d["delta"]), d["module"]))
    return modules


def preload_checks(a: RunModel, b: RunModel) -> list[dict[str, Any]]:
    """For each `preload` finding of A: did B apply it (its forkservers preload the modules; `tried`:
    some of them, so a start that never tried the advice is not reported as failing it), and
    per rank the predicted saving (A's measured re-import seconds) against the realised one
    (A's import seconds minus B's, same rank); on time to ready, A's estimate against B - A."""
    held = {module for lane in b.lanes if is_forkserver(b, lane) for module in preload_list(b, lane)}
    out = []
    for f in a.findings:
        if f["kind"] != "preload" or not f["modules"]:
            continue
        modules = list(f["modules"])
        ranks = _check_ranks(a, b, f["per_rank"], set(modules))
        missing = [m for m in modules if m not in held]
        tried = len(missing) < len(modules)  # B preloads some of it: the advice was tried
        notes = []
        if not tried:
            notes.append(
                "B did not try this advice (its forkservers preload none of these modules): the realised "
                "column is what B's other differences gave, not the advice"
            )
        elif missing:
            notes.append(
                f"B's forkservers do not preload {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}"
            )
        still = [r for r in ranks if r["still_imported_s"]]
        if still:
            notes.append(
                "in B, " + ", ".join(f"{r['key']} still imported {r['still_imported_s']:.3f} s of them" for r in still)
            )
        out.append(
            {
                "start_method": f["start_method"],
                "modules": modules,
                "applied": not missing,
                "tried": tried,
                "ranks": ranks,
                "time_to_ready": {
                    "predicted_change_s": f["estimate"]["time_to_ready_s"],
                    "realised_change_s": round(b.startup_s - a.startup_s, 6),
                    "label": "estimate",
                    "basis": f["estimate"]["basis"],
                },
                "notes": notes,
            }
        )
    return out


def _check_ranks(a: RunModel, b: RunModel, per_rank: list[dict[str, Any]], modules: set[str]) -> list[dict[str, Any]]:
    """Per rank of a preload finding of A: predicted, realised, and what B still imported of it."""
    ka, kb = lane_keys(a), lane_keys(b)
    key_of = {lane.index: key for key, lane in ka.items()}
    out = []
    for r in per_rank:
        key = key_of.get(r["lane"], "")
        la: Lane = a.lanes[r["lane"]]
        lb = kb.get(key)
        left = None if lb is None else covered_ns(b, lb, modules) / 1e9
        out.append(
            {
                "key": key,
                "pid_a": la.pid,
                "pid_b": lb.pid if lb is not None else None,
                "predicted_s": r["seconds"],
                "realised_s": None if lb is None else round((la.import_ns - lb.import_ns) / 1e9, 6),
                "still_imported_s": None if left is None else round(left, 6),
            }
        )
    return out


def compile_checks(a: RunModel, b: RunModel) -> list[dict[str, Any]]:
    """For each `cold_compile` finding of A: the saving it predicted (the backend compile of the
    graphs that missed, slowest rank) against the realised one (A's exclusive compile seconds
    minus B's, on the rank that was slowest in A), and B's cache hits and misses."""
    out = []
    kb = lane_keys(b)
    key_of = {lane.index: key for key, lane in lane_keys(a).items()}
    misses_b = sum(f.get("cache_misses", 0) for f in b.findings if f["kind"] == "cold_compile")
    for f in a.findings:
        if f["kind"] != "cold_compile":
            continue
        worst = max(f["lanes"], key=lambda i: a.lanes[i].breakdown.get("compile", 0))
        key = key_of.get(worst, "")
        lb = kb.get(key)
        compile_a = a.lanes[worst].breakdown.get("compile", 0) / 1e9
        compile_b = None if lb is None else lb.breakdown.get("compile", 0) / 1e9
        out.append(
            {
                "key": key,
                "cache_dirs": f["cache_dirs"],
                "misses_a": f["cache_misses"],
                "misses_b": misses_b,
                "compile_s": _pair(compile_a, compile_b),
                "predicted_saving_s": f["predicted_saving_s"],
                "realised_saving_s": None if compile_b is None else round(compile_a - compile_b, 6),
            }
        )
    return out
