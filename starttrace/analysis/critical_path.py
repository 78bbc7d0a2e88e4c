"""The critical path: the chain of spans across processes that ends at the run's ready (or at its
first token: `RunModel.until`)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import polars as pl

from starttrace.analysis.breakdown import RENAMED, WAIT, labels_between
from starttrace.analysis.model import STRUCTURAL_PHASES, Lane, PathStep, RunModel, SpanNode


def critical_path(model: RunModel, max_steps: int = 5000) -> list[PathStep]:
    """The chain of spans that ends at the run's `ready` (else at the run's last moment).

    Walking backwards from the target time t in lane L: take the span of L (any depth, not the
    `process` span) that ended last at or before t; if a child process launched while that span
    was open finished its own work just before the span ended (within 5 % / 2 ms), the span was
    waiting for that child: continue in the child's lane instead. Otherwise, if it is not an
    import and has child spans that are not imports, the path goes on inside it: the span's own
    time after its last such child is a step (`self`), then that child
    is taken (so `vllm.engine_core.init` shows the executor's wait for its workers and the KV cache
    set-up, not one step). An import stays one step. In a lane the path entered through such a
    wait, an idle stretch (the lane's last span before t ended earlier than a span of the lane
    that waited for it) means the lane was waiting for that one (a worker idles until the engine
    core sends its next request): the path goes back there. At the start of a lane, continue in
    the lane that launched it, before its launch span. A child that exited before the span ended
    counts as ending at its exit (the parent waited for it: `subprocess.run`, a join). Time between
    chosen spans is a `gap` step (phase `unexplained`), so the steps add up to time to ready.
    """
    if not model.spans.height:
        return []
    lanes = model.lanes
    per_lane, ends = _candidates(model)
    steps_of = _Steppable(model)
    starter = _starters(model)
    children_of: dict[int, list[tuple[Lane, SpanNode]]] = {}
    for child_index, span in starter.items():
        children_of.setdefault(span.lane, []).append((lanes[child_index], span))
    lane_i, t = _target(model)
    steps: list[PathStep] = []
    gaps = _Gaps(model)
    entered: dict[int, int] = {}  # child lane -> the time the path last entered it from a wait
    waited_by: dict[int, int] = {}  # lane -> the lane whose span waited for it
    if model.until == "first_token":
        t = _into_open_request(model, steps_of, steps, lane_i, t)
    for _ in range(max_steps):
        chosen = _last_ended(per_lane[lane_i], model, t)
        back = waited_by.get(lane_i)
        if chosen is not None and back is not None:
            other = _last_ended(per_lane[back], model, t)
            if other is not None and other.eff_end > chosen.eff_end + IDLE_MIN_NS:
                lane_i = back  # idle here while the lane that waited for this one worked on
                continue
        if chosen is None:
            launcher = starter.get(lane_i)
            if launcher is None or launcher.lane == lane_i:
                break
            if launcher.start < t:
                end = min(max(lanes[lane_i].start, launcher.start), t)
                gaps.add(steps, lane_i, end, t)
                steps.append(PathStep(launcher.lane, launcher.name, launcher.phase, launcher.start, end, "launch"))
            lane_i, t = launcher.lane, launcher.start
            continue
        gaps.add(steps, lane_i, chosen.eff_end, t)  # the lane's time after its chosen span
        waited = _waited_child(chosen, children_of.get(lane_i, []), per_lane, ends, entered)
        if waited is not None:
            child, c_end = waited
            entered[child.index] = c_end
            waited_by[child.index] = lane_i
            if chosen.eff_end > c_end:
                if _explicit_wait(chosen) and _exited_by(child, c_end):
                    # the child's exit after its last record (interpreter shutdown), until the wait returned
                    steps.append(PathStep(child.index, "(exiting)", "exit", c_end, chosen.eff_end, "gap"))
                else:
                    steps.append(PathStep(lane_i, chosen.name, chosen.phase, c_end, chosen.eff_end, "wait"))
            lane_i, t = child.index, c_end
            continue
        inner = steps_of.last_inner(chosen, t)
        if inner is not None:
            tail_end = min(chosen.eff_end, t)
            if tail_end > inner.eff_end:  # however short: the steps tile the time to ready
                steps.append(PathStep(lane_i, chosen.name, chosen.phase, inner.eff_end, tail_end, "self"))
            t = inner.eff_end
            continue
        steps.append(PathStep(lane_i, chosen.name, chosen.phase, chosen.start, chosen.eff_end))
        t = chosen.start
    if steps:
        gaps.add(steps, steps[-1].lane, model.t0, steps[-1].start)
    steps.reverse()
    return _merged(steps)


class _Gaps:
    """Time the walk passed over in a lane with no step of its own: named by the innermost span
    of that lane open over it (`self`: e.g. a compile's time between its imports; a busy loop's is
    `wait`), else `gap` (phase `unexplained`). So the steps add up to the time to ready."""

    def __init__(self, model: RunModel) -> None:
        self.model = model
        self.starts: dict[int, np.ndarray] = {}

    def add(self, steps: list[PathStep], lane_i: int, a: int, b: int) -> None:
        if b <= a:
            return
        cover = self._innermost(lane_i, a, b)
        ready = self.model.ready_ns
        if cover is None and self.model.until == "first_token" and ready is not None and b > ready:
            # a ready server that no span explains waits for the request (analysis/breakdown.py)
            if a < ready:
                steps.append(PathStep(lane_i, "(waiting for a request)", WAIT, ready, b, "gap"))
                steps.append(PathStep(lane_i, "(no span)", "unexplained", a, ready, "gap"))
            else:
                steps.append(PathStep(lane_i, "(waiting for a request)", WAIT, a, b, "gap"))
        elif cover is None:
            steps.append(PathStep(lane_i, "(no span)", "unexplained", a, b, "gap"))
        else:
            steps.append(PathStep(lane_i, cover.name, RENAMED.get(cover.phase, cover.phase), a, b, "self"))

    def _innermost(self, lane_i: int, a: int, b: int) -> SpanNode | None:
        lane = self.model.lanes[lane_i]
        starts = self.starts.get(lane_i)
        if starts is None:
            starts = self.starts[lane_i] = self.model.lane_rows(lane)["start"].to_numpy()
        k = int(np.searchsorted(starts, a, side="right")) - 1
        # the span that started last before `a`, then its ancestors: the first that covers [a, b]
        node = self.model.node(lane.offset + k) if k >= 0 else None
        while node is not None:
            if node.eff_end >= b and node.phase not in STRUCTURAL_PHASES and not node.instant:
                return node
            parent = node.parent_node
            node = parent if parent is not None and parent.lane == lane_i else None
        return None


def _into_open_request(model: RunModel, steps_of: _Steppable, steps: list[PathStep], lane_i: int, t: int) -> int:
    """Ending at the first token: the request span that sent it is still open then (it ends with
    the response). Its own time up to the token is the last step; the walk goes on from its last
    child that ended before the token (else from its start). Returns where the walk goes on."""
    token = model.matching(names=("first_token",)).filter(pl.col("start") == t)
    if not token.height:
        return t
    node = model.node(int(token["idx"][0])).parent_node
    for _ in range(MAX_UP):
        if node is None or node.lane != lane_i or node.phase in STRUCTURAL_PHASES:
            break
        if node.start < t <= node.eff_end:
            inner = steps_of.last_inner(node, t)
            low = inner.eff_end if inner is not None else node.start
            if t > low:
                steps.append(PathStep(lane_i, node.name, node.phase, low, t, "self"))
            return low
        node = node.parent_node
    return t


MAX_UP = 100  # bounded walk up a span's ancestors (guards cycles)


def _merged(steps: list[PathStep]) -> list[PathStep]:
    """Adjacent steps of one span's own time (or of one gap) in one lane as one step."""
    out: list[PathStep] = []
    for st in steps:
        prev = out[-1] if out else None
        if (
            prev is not None
            and st.kind in ("self", "gap")
            and (prev.kind, prev.lane, prev.name) == (st.kind, st.lane, st.name)
            and prev.end == st.start
        ):
            prev.end = st.end
        else:
            out.append(st)
    return out


IDLE_MIN_NS = 2_000_000  # an idle stretch this long in a waited-for lane returns the path to the waiting lane


def path_by_lane(steps: list[PathStep]) -> list[tuple[int, int]]:
    """(lane index, ns of the path's steps in that lane), most first: which process holds how
    much of the time to ready (a TP16 run: which rank the path goes through, and for how long)."""
    total: dict[int, int] = {}
    for st in steps:
        total[st.lane] = total.get(st.lane, 0) + (st.end - st.start)
    return sorted(total.items(), key=lambda item: (-item[1], item[0]))


def path_phases(model: RunModel) -> dict[str, int]:
    """Phase -> ns of the critical path, most first: the run's time to ready by phase (the steps
    add up to it, so these do too). Each step counts by its lane's exclusive timeline (a
    bootstrap step that imported counts as import); time outside the lane's window by the step's
    own phase."""
    total: dict[str, int] = {}
    for st in model.critical_path:
        parts = labels_between(model.lanes[st.lane], st.start, st.end)
        rest = (st.end - st.start) - sum(parts.values())
        if rest > 0:
            parts[st.phase] = parts.get(st.phase, 0) + rest
        for label, ns in parts.items():
            total[label] = total.get(label, 0) + ns
    return dict(sorted(total.items(), key=lambda item: (-item[1], item[0])))


@dataclass
class _Candidates:
    """A lane's spans that can be on the path, sorted by end (then the longest first): their rows,
    starts and ends."""

    rows: np.ndarray
    starts: np.ndarray
    ends: np.ndarray


def _candidates(model: RunModel) -> tuple[list[_Candidates], list[np.ndarray]]:
    """Per lane, the spans that can be on the path (sorted by end), and their ends."""
    keep = ~model.array("structural") & ~model.array("instant") & (model.array("duration") > 0)
    keep[[ln.process_span.idx for ln in model.lanes if ln.process_span is not None]] = False
    order = (
        model.spans.select("lane", "eff_end", "duration")
        .filter(keep)
        .select(pl.arg_sort_by("lane", "eff_end", "duration", descending=[False, False, True], maintain_order=True))
        .to_series()
        .to_numpy()
    )
    rows = np.flatnonzero(keep)[order]
    starts, ends = model.array("start")[rows], model.array("eff_end")[rows]
    bounds = np.searchsorted(model.array("lane")[rows], np.arange(len(model.lanes) + 1))
    per_lane = [_Candidates(rows[a:b], starts[a:b], ends[a:b]) for a, b in itertools.pairwise(bounds)]
    return per_lane, [c.ends for c in per_lane]


def _starters(model: RunModel) -> dict[int, SpanNode]:
    """Who started whom: lane index -> the launch/fork span that made it, preferring the launch
    *request* (a `process.launch` with the child's pid, e.g. in the requester of a forkserver child)."""
    lanes = model.lanes
    by_pid: dict[int, Lane] = {ln.pid: ln for ln in lanes if ln.pid is not None}
    starter: dict[int, SpanNode] = {}
    for n in model.select(("launch", "fork", "forkserver")):  # by lane, then start
        child_pid = n.attrs.get("starttrace.child_pid")
        if isinstance(child_pid, int):
            child = by_pid.get(child_pid)
            if child is None or child.index == n.lane:
                continue
            prev = starter.get(child.index)
            if prev is None or (prev.phase == "fork" and n.phase == "launch"):
                starter[child.index] = n
    for lane in lanes:
        if lane.index not in starter and lane.launched_by is not None:
            starter[lane.index] = lane.launched_by
    return starter


def _target(model: RunModel) -> tuple[int, int]:
    """Where the path ends: the run's `ready` (its first token: `model.until`), else the span that
    ended last."""
    end = model.end_ns
    if end is not None:
        name = "first_token" if model.until == "first_token" else "ready"
        ready = model.matching(names=(name,)).filter(pl.col("start") == end)
        return (int(ready["lane"][0]) if ready.height else 0), end
    last = model.spans.row(int(model.spans["eff_end"].arg_max() or 0), named=True)
    return last["lane"], last["eff_end"]


class _Steppable:
    """Per span (numpy arrays over the model's table, made once per path): whether it can be a step
    of its own inside its parent (not an import, a process or startup span, nor an instant, and it
    lasted), its start and its end: the walk asks this of a chosen span's children at every step."""

    def __init__(self, model: RunModel) -> None:
        self.model = model
        self.ok = (
            ~model.array("is_import")
            & ~model.array("structural")
            & ~model.array("instant")
            & (model.array("duration") > 0)
        )
        self.starts = model.array("start")
        self.ends = model.array("eff_end")

    def last_inner(self, span: SpanNode, t: int) -> SpanNode | None:
        """The child span of `span` that can be a step and ended last at or before t, having started
        before it; None for an import (its nested imports stay inside its step)."""
        if span.phase == "import":
            return None
        rows = self.model.child_rows(span.idx)
        if not len(rows):
            return None
        ends = self.ends[rows]
        rows = rows[self.ok[rows] & (ends <= t) & (self.starts[rows] < t)]
        if not len(rows):
            return None
        return self.model.node(int(rows[int(np.argmax(self.ends[rows]))]))


def _last_ended(cand: _Candidates, model: RunModel, t: int) -> SpanNode | None:
    """The span that ended last at or before t and started before it; the widest of equals."""
    ends, starts = cand.ends, cand.starts
    k = int(np.searchsorted(ends, t, side="right")) - 1
    while k >= 0:
        if starts[k] < t:
            chosen = k
            j = k - 1
            while j >= 0 and ends[j] == ends[k]:
                if starts[j] < starts[chosen]:
                    chosen = j
                j -= 1
            return model.node(int(cand.rows[chosen]))
        k -= 1
    return None


def _explicit_wait(span: SpanNode) -> bool:
    """A span that waited for one named child process (`process.wait`: Popen.wait/communicate)."""
    return span.phase == "wait" and isinstance(span.attrs.get("starttrace.child_pid"), int)


def _exited_by(child: Lane, t: int) -> bool:
    proc = child.process_span
    return proc is not None and not proc.in_progress and proc.eff_end <= t


def _waited_child(
    span: SpanNode,
    children: list[tuple[Lane, SpanNode]],
    per_lane: list[_Candidates],
    ends: list[np.ndarray],
    entered: dict[int, int],
) -> tuple[Lane, int] | None:
    """The child process `span` was waiting for: launched before `span` ended, and its own work
    ended just before `span` did (within 5 % of the span or 2 ms; for a `process.wait` naming the
    child, any time before the wait returned). A child the path entered before is entered again
    only at an earlier time (so the walk ends)."""
    best: tuple[Lane, int] | None = None
    slack = max(2_000_000, (span.eff_end - span.start) // 20)
    own_child = span.attrs.get("starttrace.child_pid")
    if _explicit_wait(span):
        slack = span.eff_end - span.start  # a wait for a named child (Popen.wait): whatever its exit took
    for child, launch in children:
        if launch.start > span.eff_end:
            continue
        if isinstance(own_child, int) and child.pid != own_child:
            continue  # a launch span waits for its own child only
        cend = ends[child.index]
        k = int(np.searchsorted(cend, span.eff_end, side="right")) - 1
        c_end = int(cend[k]) if k >= 0 else None
        proc = child.process_span
        if proc is not None and not proc.in_progress and proc.eff_end <= span.eff_end:
            # a child that exited: the parent waited for its exit (subprocess.run, a join), which
            # may come well after its last span (a helper's work that has no span of its own)
            if c_end is None or proc.eff_end > c_end:
                c_end = proc.eff_end
        if c_end is None:
            continue
        if child.index in entered and c_end >= entered[child.index]:
            continue
        if c_end >= span.eff_end - slack and c_end > span.start and (best is None or c_end > best[1]):
            best = (child, c_end)
    return best
