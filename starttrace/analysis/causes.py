"""Why run B's time to ready differs from run A's: causes, ranked, and the CI gate.

The change of time to ready is split along each run's critical path (`path_phases`: the path's
steps add up to time to ready, so its phases do too). Each phase's change B - A goes to one cause:

1. start-kind differences (analysis/start_kind.py) first, each taking the phases its state decides:
   the compile cache takes `compile`, the page cache / weights source / weights filesystem take
   `model_load` (the first that differs), the startup plan takes `kv_cache`;
2. configuration, hardware and software differences (the fingerprint) come next: named, with
   `seconds` null, since no single phase measures them (their effect is in the phases below);
3. every other phase whose time on the path changed, with the ranks and modules that changed most
   beside it (`detail`: per rank the lane's own seconds of that phase, per module the import's
   cumulative seconds; not along the path, so not added up).

The causes' seconds plus `unexplained` (the path's untraced gaps, and any rest when a run's path
does not reach its ready) equal the change of time to ready.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starttrace.analysis.critical_path import path_phases
from starttrace.analysis.model import RunModel
from starttrace.analysis.nodes import lane_keys
from starttrace.analysis.start_kind import KIND_KEYS, fingerprint, start_kind

# the phases each start-kind key decides, in KIND_KEYS order
KIND_PHASES = {
    "compile_cache": ("compile",),
    "page_cache": ("model_load",),
    "weights_source": ("model_load",),
    "weights_fs": ("model_load",),
    "plan_cache": ("kv_cache",),
}
UNEXPLAINED = "unexplained"  # the critical path's gap steps (breakdown.py's label for untraced time)
MIN_PHASE_S = 0.001  # a phase that changed less than this along the path is not a cause
DETAIL = 5  # ranks and modules named beside a phase
UNLIKE_GROUPS = ("config.", "hardware.")  # fingerprint differences that make two starts unlike

# the gate's exit codes (`starttrace compare --max-regression`)
GATE_PASS = 0
GATE_REGRESSION = 1
GATE_UNLIKE = 3  # 2 is the CLI's code for bad input


def causes(a: RunModel, b: RunModel) -> dict[str, Any]:
    """`{"change_s", "causes": [{key, from, to, seconds, ...}], "unexplained_s", "kind", "fingerprint"}`."""
    kind_a, kind_b = start_kind(None, a), start_kind(None, b)
    print_a, print_b = fingerprint(None, a), fingerprint(None, b)
    path_a = {k: v / 1e9 for k, v in path_phases(a).items()}
    path_b = {k: v / 1e9 for k, v in path_phases(b).items()}
    delta = {p: path_b.get(p, 0.0) - path_a.get(p, 0.0) for p in dict.fromkeys([*path_a, *path_b])}
    taken: set[str] = {UNEXPLAINED}
    out: list[dict[str, Any]] = []
    for key in KIND_KEYS:
        if kind_a[key] == kind_b[key]:
            continue
        phases = [p for p in KIND_PHASES[key] if p not in taken]
        taken.update(phases)
        out.append(
            {
                "key": f"kind.{key}",
                "from": kind_a[key],
                "to": kind_b[key],
                "seconds": round(sum(delta.get(p, 0.0) for p in phases), 6),
                "phases": phases,
            }
        )
    for key in sorted(set(print_a) | set(print_b)):
        if print_a.get(key) != print_b.get(key):
            out.append({"key": f"fingerprint.{key}", "from": print_a.get(key), "to": print_b.get(key), "seconds": None})
    rest = [
        {
            "key": f"phase.{phase}",
            "from": round(path_a.get(phase, 0.0), 6),
            "to": round(path_b.get(phase, 0.0), 6),
            "seconds": round(d, 6),
            "phases": [phase],
            "detail": _detail(a, b, phase),
        }
        for phase, d in delta.items()
        if phase not in taken and abs(d) >= MIN_PHASE_S
    ]
    rest.sort(key=lambda c: -abs(c["seconds"]))
    out.extend(rest)
    change = _change(a, b)
    explained = sum(c["seconds"] for c in out if c["seconds"] is not None)
    return {
        "change_s": None if change is None else round(change, 6),
        "causes": out,
        "unexplained_s": None if change is None else round(change - explained, 6),
        "kind": {"a": kind_a, "b": kind_b},
        "fingerprint": {"a": print_a, "b": print_b},
    }


def _change(a: RunModel, b: RunModel) -> float | None:
    if a.ready_ns is None or b.ready_ns is None:
        return None
    return ((b.ready_ns - b.t0) - (a.ready_ns - a.t0)) / 1e9


def _detail(a: RunModel, b: RunModel, phase: str) -> list[dict[str, Any]]:
    """The ranks whose own `phase` seconds changed most, and for imports the modules."""
    rows = []
    ka, kb = lane_keys(a), lane_keys(b)
    for key in dict.fromkeys([*ka, *kb]):
        sa = ka[key].breakdown.get(phase, 0) / 1e9 if key in ka else 0.0
        sb = kb[key].breakdown.get(phase, 0) / 1e9 if key in kb else 0.0
        if abs(sb - sa) >= MIN_PHASE_S:
            rows.append({"key": f"rank {key}", "from": round(sa, 6), "to": round(sb, 6), "seconds": round(sb - sa, 6)})
    rows.sort(key=lambda r: -abs(r["seconds"]))
    out = rows[:DETAIL]
    if phase == "import":
        ma = {h["module"]: h["cumulative_s"] for h in a.hotspots}
        mb = {h["module"]: h["cumulative_s"] for h in b.hotspots}
        mods = [
            {"key": f"module {m}", "from": round(ma.get(m, 0.0), 6), "to": round(mb.get(m, 0.0), 6)}
            for m in set(ma) | set(mb)
        ]
        for m in mods:
            m["seconds"] = round(m["to"] - m["from"], 6)
        mods.sort(key=lambda r: (-abs(r["seconds"]), r["key"]))
        out += [m for m in mods[:DETAIL] if abs(m["seconds"]) >= MIN_PHASE_S]
    return out


@dataclass
class Verdict:
    code: int  # GATE_PASS, GATE_REGRESSION or GATE_UNLIKE
    message: str


def unlike(found: dict[str, Any]) -> list[str]:
    """What makes the two starts unlike: `key: from -> to` for start-kind, configuration and hardware."""
    out = []
    for c in found["causes"]:
        key = c["key"]
        if key.startswith("kind.") or (
            key.startswith("fingerprint.") and key[len("fingerprint.") :].startswith(UNLIKE_GROUPS)
        ):
            out.append(f"{key}: {c['from']} -> {c['to']}")
    return out


def gate(a: RunModel, b: RunModel, max_regression_pct: float, allow_unlike: bool = False) -> Verdict:
    """CI: B (new) against A (baseline). Unlike starts are refused (GATE_UNLIKE) unless allowed; B
    slower by more than `max_regression_pct` % of A's time to ready fails (GATE_REGRESSION)."""
    found = causes(a, b)
    differs = unlike(found)
    if differs and not allow_unlike:
        return Verdict(
            GATE_UNLIKE,
            "refused: the starts are not alike (--allow-unlike compares them anyway): " + "; ".join(differs),
        )
    if a.ready_ns is None:
        return Verdict(GATE_UNLIKE, f"refused: the baseline {a.run_id} never became ready")
    if b.ready_ns is None:
        return Verdict(GATE_REGRESSION, f"regression: {b.run_id} never became ready")
    ttr_a, ttr_b = (a.ready_ns - a.t0) / 1e9, (b.ready_ns - b.t0) / 1e9
    pct = 100.0 * (ttr_b - ttr_a) / ttr_a if ttr_a > 0 else 0.0
    line = f"time to ready {ttr_a:.2f} s -> {ttr_b:.2f} s ({pct:+.1f} %, limit +{max_regression_pct:g} %)"
    if pct > max_regression_pct:
        top = next((c for c in found["causes"] if c["seconds"] is not None), None)
        why = f"; top cause {top['key']} {top['seconds']:+.2f} s" if top else ""
        return Verdict(GATE_REGRESSION, f"regression: {line}{why}")
    return Verdict(GATE_PASS, f"ok: {line}")
