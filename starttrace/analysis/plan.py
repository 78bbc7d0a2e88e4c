"""The plan: what the findings' actions would give, each alone and all together.

Each finding whose action takes time out of the start says which time: per lane, stretches of its
exclusive timeline (`Cut`: start, end, and the share of it the action removes). A cold compile
takes out its share (the Inductor compile of the graphs that missed, of the rank's compile time)
of the ranks' `compile` segments; a preload its per-rank import seconds of the ranks' `import`
segments, scaled to its own estimate (which counts what the forkserver pays); a cold model
inspection the inspection helper's imports.

The plan replays the critical path with those stretches taken out (never counting an instant
twice where two findings cut the same time: the larger share wins), not by summing the findings:
two findings that shorten the same stretch of the path save once. The path is then held against
each rank's own predicted ready (its ready minus what is cut from the path before it started and
from its own timeline after), so that a rank the path did not go through, and that the cuts do
not shorten, still bounds the start. The path is not walked again: a lane that ran alongside it
(not a rank) and that the cuts leave as long may end later than predicted.

Each finding gets `saving_s`: its own change of time to ready (the replay with its cuts alone;
None when its action has no predicted saving: a straggler, a CUDA audit issue). The plan is
`{predicted_ready_s, saving_s, findings: [...]}` (docs/findings.md). `plan_check` sets a plan
against the next start: per finding, predicted saving against the time the next start spent in
the same stretches (what it realised).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import Any

from starttrace.analysis.model import Lane, RunModel
from starttrace.analysis.vllm_lanes import inspection_helpers

Cut = tuple[int, int, float]  # start ns, end ns, share of it the action takes out
Cuts = dict[int, list[Cut]]  # lane index -> its cuts

RANK_ROLES = ("worker", "child")


def _segments(lane: Lane, label: str, until: int | None = None) -> Iterable[tuple[int, int]]:
    for a, b, seg in lane.timeline:
        if seg == label and (until is None or a < until):
            yield a, b if until is None else min(b, until)


def _label_cuts(model: RunModel, lanes: Iterable[int], label: str, share: Callable[[Lane], float]) -> Cuts:
    out: Cuts = {}
    for i in lanes:
        lane = model.lanes[i]
        part = max(0.0, min(1.0, share(lane)))
        if part > 0:
            out[i] = [(a, b, part) for a, b in _segments(lane, label)]
    return out


def _compile_cuts(model: RunModel, f: dict[str, Any]) -> Cuts:
    compile_s = max((model.lanes[i].breakdown.get("compile", 0) / 1e9 for i in f["lanes"]), default=0.0)
    saving = f.get("predicted_saving_s") or 0.0
    return _label_cuts(model, f["lanes"], "compile", lambda _lane: saving / compile_s if compile_s else 0.0)


def _preload_cuts(model: RunModel, f: dict[str, Any]) -> Cuts:
    """The ranks' re-imports, less what the forkserver pays (its interpreter start and preload):
    the share of each rank's import time that the finding's own estimate says comes off."""
    seconds = {r["lane"]: r["seconds"] for r in f.get("per_rank", [])}
    estimate = -((f.get("estimate") or {}).get("time_to_ready_s") or 0.0)
    slowest = max(seconds.values(), default=0.0)
    kept = max(0.0, min(1.0, estimate / slowest)) if slowest else 0.0

    def share(lane: Lane) -> float:
        imports = lane.breakdown.get("import", 0) / 1e9
        return kept * seconds.get(lane.index, 0.0) / imports if imports else 0.0

    return _label_cuts(model, seconds, "import", share)


def _inspection_cuts(model: RunModel, f: dict[str, Any]) -> Cuts:
    helper = f.get("helper_lane")
    return _label_cuts(model, [helper] if isinstance(helper, int) else [], "import", lambda _lane: 1.0)


CUTTERS: dict[str, Callable[[RunModel, dict[str, Any]], Cuts]] = {
    "cold_compile": _compile_cuts,
    "preload": _preload_cuts,
    "cold_model_inspection": _inspection_cuts,
}


def finding_cuts(model: RunModel, f: dict[str, Any]) -> Cuts | None:
    """The time a finding's action takes out, per lane; None: no predicted saving."""
    cutter = CUTTERS.get(f["kind"])
    return None if cutter is None else cutter(model, f)


def _merged(cuts: Iterable[Cuts]) -> Cuts:
    out: Cuts = {}
    for c in cuts:
        for lane, parts in c.items():
            out.setdefault(lane, []).extend(parts)
    return out


def _disjoint(parts: list[Cut]) -> list[Cut]:
    """`parts` as disjoint cuts in time order (where parts overlap, the largest share counts)."""
    events: list[tuple[int, int, float]] = []
    for a, b, share in parts:
        if b > a and share > 0:
            events.append((a, 1, share))
            events.append((b, -1, share))
    events.sort()
    out: list[Cut] = []
    active: dict[float, int] = {}
    at = events[0][0] if events else 0
    for t, step, share in events:
        if active and t > at:
            top = max(active)
            if out and out[-1][1] == at and out[-1][2] == top:
                out[-1] = (out[-1][0], t, top)
            else:
                out.append((at, t, top))
        at = t
        active[share] = active.get(share, 0) + step
        if not active[share]:
            del active[share]
    return out


class _Profile:
    """A lane's cuts as a function of time: how many ns they take out before t (prefix sums over
    the disjoint cuts), so that what they take out of any stretch is two look-ups."""

    def __init__(self, parts: list[Cut]) -> None:
        self.cuts = _disjoint(parts)
        self.starts = [a for a, _, _ in self.cuts]
        self.before = [0.0]
        for a, b, share in self.cuts:
            self.before.append(self.before[-1] + (b - a) * share)

    def upto(self, t: int) -> float:
        k = bisect.bisect_right(self.starts, t) - 1
        if k < 0:
            return 0.0
        a, b, share = self.cuts[k]
        return self.before[k] + (min(t, b) - a) * share

    def between(self, start: int, end: int) -> float:
        return max(0.0, self.upto(end) - self.upto(start)) if end > start else 0.0


def _removed(parts: list[Cut], start: int, end: int) -> float:
    """Ns taken out of [start, end] by `parts` (where parts overlap, the largest share counts)."""
    return _Profile(parts).between(start, end)


def replay(model: RunModel, cuts: Cuts) -> float:
    """The time to ready (s) with `cuts` taken out: the critical path's steps shortened by what is
    cut from them, held against every rank's own shortened ready (its ready, less what is cut from
    the path before it started and from its own timeline after)."""
    profiles = {lane: _Profile(parts) for lane, parts in cuts.items() if parts}
    path = [(st, profiles.get(st.lane)) for st in model.critical_path]
    removed = sum(p.between(st.start, st.end) for st, p in path if p is not None)
    predicted = model.startup_s - removed / 1e9
    for lane in model.lanes:
        if lane.role in RANK_ROLES and lane.ready_ns is not None and model.ready_ns is not None:
            own = profiles[lane.index].between(lane.start, lane.ready_ns) if lane.index in profiles else 0.0
            own += sum(p.between(st.start, min(st.end, lane.start)) for st, p in path if p is not None)
            predicted = max(predicted, (lane.ready_ns - model.t0 - own) / 1e9)
    return min(model.startup_s, predicted)


def set_savings(model: RunModel, findings: list[dict[str, Any]]) -> None:
    """Each finding's `saving_s`: its own change of time to ready (None: not predicted)."""
    for f in findings:
        cuts = finding_cuts(model, f)
        f["saving_s"] = None if cuts is None else round(model.startup_s - replay(model, cuts), 6)


def plan(model: RunModel) -> dict[str, Any]:
    """`{predicted_ready_s, saving_s, findings}`: the time to ready with every finding's action
    applied (one replay of the path with all their cuts), and the findings that save, most first."""
    saving = [f for f in model.findings if f.get("saving_s")]
    saving.sort(key=lambda f: -f["saving_s"])
    cuts = _merged(c for f in saving if (c := finding_cuts(model, f)) is not None)
    predicted = replay(model, cuts) if cuts else model.startup_s
    return {
        "ready_s": round(model.startup_s, 6),
        "predicted_ready_s": round(predicted, 6),
        "saving_s": round(model.startup_s - predicted, 6),
        "sum_of_savings_s": round(sum(f["saving_s"] for f in saving), 6),
        "findings": [
            {"kind": f["kind"], "saving_s": f["saving_s"], "action": f["action"], "index": model.findings.index(f)}
            for f in saving
        ],
    }


def _path_time(model: RunModel, cuts: Cuts) -> float:
    """Seconds of the critical path inside `cuts` (at their full length: what the stretches took)."""
    profiles = {lane: _Profile([(a, b, 1.0) for a, b, _ in parts]) for lane, parts in cuts.items() if parts}
    return sum(profiles[st.lane].between(st.start, st.end) for st in model.critical_path if st.lane in profiles) / 1e9


def _same_stretches(model: RunModel, kind: str, like: dict[str, Any]) -> Cuts:
    """In another start (`model`), the stretches a finding of `kind` would cut there, at full
    share, whether or not that start has the finding (a warm start has no cold compile)."""
    if kind == "cold_compile":
        ranks = [ln.index for ln in model.lanes if ln.role in RANK_ROLES]
        return _label_cuts(model, ranks, "compile", lambda _lane: 1.0)
    if kind == "preload":
        ranks = [ln.index for ln in model.lanes if ln.role in RANK_ROLES]
        return _label_cuts(model, ranks, "import", lambda _lane: 1.0)
    if kind == "cold_model_inspection":
        return _label_cuts(model, [ln.index for ln in inspection_helpers(model)], "import", lambda _lane: 1.0)
    return {}


def plan_check(a: RunModel, b: RunModel) -> dict[str, Any]:
    """A's plan against B (the next start): per finding of A's plan, its predicted saving against
    the realised one (the critical-path time A spent in the finding's stretches minus the time B
    spent in the same stretches), and the predicted ready against B's."""
    own = plan(a)
    rows = []
    for entry in own["findings"]:
        f = a.findings[entry["index"]]
        whole_a = {lane: [(s, e, 1.0) for s, e, _ in parts] for lane, parts in (finding_cuts(a, f) or {}).items()}
        spent_a = _path_time(a, whole_a)
        spent_b = _path_time(b, _same_stretches(b, f["kind"], f))
        realised = round(spent_a - spent_b, 6)
        rows.append(
            {
                "kind": f["kind"],
                "predicted_saving_s": entry["saving_s"],
                "realised_saving_s": realised,
                "path_s": {"a": round(spent_a, 6), "b": round(spent_b, 6)},
                "acted_on": realised >= 0.5 * entry["saving_s"],
            }
        )
    return {
        "predicted_ready_s": own["predicted_ready_s"],
        "ready_s": {"a": round(a.startup_s, 6), "b": round(b.startup_s, 6)},
        "predicted_saving_s": own["saving_s"],
        "realised_saving_s": round(a.startup_s - b.startup_s, 6),
        "findings": rows,
    }
