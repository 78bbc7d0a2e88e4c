"""Run A vs run B: per phase, per rank, per module."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from starttrace.analysis.model import RunModel

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

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "summary": self.summary,
            "phases": self.phases,
            "ranks": self.ranks,
            "modules": self.modules,
            "notes": self.notes,
        }


def _delta(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    return round(b - a, 6)


def _lane_keys(model: RunModel) -> dict[str, Any]:
    """Match lanes across runs by role + rank; lanes without a rank by role + order of start."""
    out: dict[str, Any] = {}
    counters: dict[str, int] = defaultdict(int)
    for lane in sorted(model.lanes, key=lambda ln: (ln.start, ln.index)):
        role = lane.role or "process"
        if lane.rank is not None:
            key = f"{role} rank {lane.rank}"
        else:
            key = f"{role} #{counters[role]}"
            counters[role] += 1
        out[key] = lane
    return out


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
        phases=_phases(a, b),
        ranks=_ranks(a, b),
        modules=_modules(a, b)[:MAX_MODULES],
        notes=notes,
    )


def _summary(a: RunModel, b: RunModel) -> dict[str, Any]:
    return {
        "startup_s": {
            "a": round(a.startup_s, 6),
            "b": round(b.startup_s, 6),
            "delta": round(b.startup_s - a.startup_s, 6),
        },
        "processes": {"a": len(a.lanes), "b": len(b.lanes), "delta": len(b.lanes) - len(a.lanes)},
        "spans": {"a": len(a.spans), "b": len(b.spans), "delta": len(b.spans) - len(a.spans)},
        "status": {"a": a.status, "b": b.status},
        "start_methods": {
            "a": sorted({ln.start_method for ln in a.lanes if ln.start_method}),
            "b": sorted({ln.start_method for ln in b.lanes if ln.start_method}),
        },
    }


def _phase_totals(m: RunModel) -> dict[str, float]:
    """Seconds per phase, summed over the lanes."""
    tot: dict[str, float] = defaultdict(float)
    for lane in m.lanes:
        for ph, ns in lane.phases.items():
            tot[ph] += ns / 1e9
    return tot


def _phases(a: RunModel, b: RunModel) -> list[dict[str, Any]]:
    pa, pb = _phase_totals(a), _phase_totals(b)
    phases = [
        {
            "phase": ph,
            "a": round(pa.get(ph, 0.0), 6),
            "b": round(pb.get(ph, 0.0), 6),
            "delta": round(pb.get(ph, 0.0) - pa.get(ph, 0.0), 6),
        }
        for ph in list(dict.fromkeys(list(a.phases) + list(b.phases)))
    ]
    phases.sort(key=lambda d: -abs(d["delta"]))
    return phases


def _pair(x: float | None, y: float | None) -> dict[str, float | None]:
    return {
        "a": None if x is None else round(x, 6),
        "b": None if y is None else round(y, 6),
        "delta": _delta(x, y),
    }


def _ranks(a: RunModel, b: RunModel) -> list[dict[str, Any]]:
    """Lanes matched by role and rank (else role and order), side by side."""
    ka, kb = _lane_keys(a), _lane_keys(b)
    ranks = []
    for key in list(dict.fromkeys(list(ka) + list(kb))):
        la, lb = ka.get(key), kb.get(key)
        ta = a.seconds(la.ready_ns) if la is not None else None
        tb = b.seconds(lb.ready_ns) if lb is not None else None
        ph_names = list(dict.fromkeys(list(la.phases if la else {}) + list(lb.phases if lb else {})))
        phases = {}
        for ph in ph_names:
            entry = _pair(la.phases.get(ph, 0) / 1e9 if la else None, lb.phases.get(ph, 0) / 1e9 if lb else None)
            entry["a"] = round(la.phases[ph] / 1e9, 6) if la and ph in la.phases else None
            entry["b"] = round(lb.phases[ph] / 1e9, 6) if lb and ph in lb.phases else None
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
