"""The exclusive breakdown of each process's time to ready (the lane field `breakdown`).

Each instant of a lane's window (its start to its ready time, else to its end) belongs to the
innermost span open at that instant: the span that started last among those open, the deeper of
two that started together. The instant counts for that span's phase; an instant no span covers
(only the `process` span) is `unexplained`. So the parts add up to the window, with nothing
counted twice: an import inside a model load counts as import, the rest of the load as
`model_load`.

A `process.wait` (Popen.wait/communicate) is `wait` when the child is traced (its time is on its
own lane); a wait for a child with no lane (gcc under Inductor's compile) counts for the phase of
the span that waited.

A busy loop (phase `idle`: vLLM's worker and engine-core loops) serves the startup calls the
engine core sends (memory profile, compile, KV cache allocation, warmup): those calls are spans of
their own phases inside the loop. The loop's time between them, before ready, is the process
waiting for its next startup call: `wait`, not idle. Time after ready is outside every window, and
a lane that starts after the run was ready (a helper of the running server) has no breakdown.

Computed as table operations over the run's span table (analysis.table): spans whose phase is the
one of their parent cannot change the innermost phase anywhere, so only the spans that change it
(a few hundred per process: top-level imports, the phases, what runs inside an import) are swept.
"""

from __future__ import annotations

import bisect
import heapq

import polars as pl

from starttrace.analysis.model import Lane, RunModel
from starttrace.analysis.table import as_int64

UNEXPLAINED = "unexplained"
WAIT = "wait"
# phases whose time inside the window is named otherwise in the breakdown
RENAMED = {"idle": WAIT}


def lane_windows(model: RunModel) -> pl.DataFrame:
    """Per lane: the window the breakdown divides (`w_start`, `w_end`), for lanes that have one."""
    rows = [
        (lane.index, as_int64(lane.start), as_int64(lane.end))
        for lane in model.lanes
        if not lane.after_ready and lane.end > lane.start
    ]
    return pl.DataFrame(rows, schema={"lane": pl.Int32, "w_start": pl.Int64, "w_end": pl.Int64}, orient="row")


def set_breakdowns(model: RunModel) -> None:
    """Fill `lane.after_ready`, `lane.timeline` and `lane.breakdown` for every lane of the model."""
    ready = model.end_ns
    for lane in model.lanes:
        lane.after_ready = ready is not None and lane.start >= ready and lane.process_span is not None
        lane.breakdown = {}
        lane.timeline = []
    windows = lane_windows(model)
    if windows.is_empty():
        return
    table = model.spans
    work = ~model.array("instant") & ~model.array("structural")
    # spans whose phase is their parent's change no innermost phase; a wait for a process that is
    # not traced (gcc under Inductor) is the enclosing phase's work
    changing = work & ~model.array("same_phase")
    untraced = untraced_waits(model)
    changing[untraced] &= model.array("parent")[untraced] < 0
    rows = (
        table.lazy()
        .select("lane", "start", pl.col("eff_end").alias("end"), "depth", "phase")
        .filter(pl.lit(pl.Series(changing)))
        .join(windows.lazy(), on="lane", how="inner", maintain_order="left")
        .with_columns(
            pl.max_horizontal("start", "w_start").alias("s"),
            pl.min_horizontal("end", "w_end").alias("e"),
        )
        .filter(pl.col("e") > pl.col("s"))
        .sort("lane", "s", "depth")
        .collect()
    )
    by_lane = {key[0]: part for key, part in rows.partition_by("lane", as_dict=True).items()}
    for lane_index, w_start, w_end in windows.iter_rows():
        part = by_lane.get(lane_index)
        spans = (
            [] if part is None else list(zip(*(part[c].to_list() for c in ("s", "e", "depth", "phase")), strict=True))
        )
        lane = model.lanes[lane_index]
        lane.timeline = sweep(spans, w_start, w_end)
        if model.until == "first_token" and model.ready_ns is not None:
            lane.timeline = _served_waits(lane.timeline, model.ready_ns)
        lane.breakdown = totals(lane.timeline)


def _served_waits(segments: list[tuple[int, int, str]], ready: int) -> list[tuple[int, int, str]]:
    """Until the first token: a ready server's time that no span explains is its wait for the
    request (or for its part of it), `wait`, not `unexplained`."""
    out: list[tuple[int, int, str]] = []
    for start, end, label in segments:
        if label != UNEXPLAINED or end <= ready:
            _append(out, start, end, label)
        elif start >= ready:
            _append(out, start, end, WAIT)
        else:
            _append(out, start, ready, label)
            _append(out, ready, end, WAIT)
    return out


def untraced_waits(model: RunModel) -> list[int]:
    """The `process.wait` spans (by idx) whose child has no lane: a program that is not Python (a
    compiler), or one that ran untraced. Their time is the waiting span's own work."""
    traced = {lane.pid for lane in model.lanes if lane.pid is not None}
    waits = model.matching(names=("process.wait",))["idx"].to_list()
    return [i for i in waits if model.attrs_of(i).get("starttrace.child_pid") not in traced]


def sweep(spans: list[tuple[int, int, int, str]], low: int, high: int) -> list[tuple[int, int, str]]:
    """The innermost phase over [low, high] of `spans` (start, end, depth, phase), clipped to the
    window: the lane's timeline, segments (start, end, label) in order that tile the window."""
    events: list[tuple[int, int, int]] = []
    for i, (s, e, _depth, _phase) in enumerate(spans):
        events.append((s, 1, i))
        events.append((e, 0, i))  # at one instant, ends before starts
    events.sort()
    segments: list[tuple[int, int, str]] = []
    open_spans: list[tuple[int, int, int]] = []  # heap of (-start, -depth, i): the innermost on top
    alive = [False] * len(spans)
    cursor = low
    for t, is_start, i in events:
        if t > cursor:
            while open_spans and not alive[open_spans[0][2]]:
                heapq.heappop(open_spans)
            _append(segments, cursor, t, _label(spans[open_spans[0][2]][3]) if open_spans else UNEXPLAINED)
            cursor = t
        if is_start:
            alive[i] = True
            heapq.heappush(open_spans, (-spans[i][0], -spans[i][2], i))
        else:
            alive[i] = False
    if high > cursor:
        _append(segments, cursor, high, UNEXPLAINED)
    return segments


def _append(segments: list[tuple[int, int, str]], start: int, end: int, label: str) -> None:
    if segments and segments[-1][2] == label and segments[-1][1] == start:
        segments[-1] = (segments[-1][0], end, label)
    else:
        segments.append((start, end, label))


def totals(segments: list[tuple[int, int, str]]) -> dict[str, int]:
    """Label -> ns of the segments, most first."""
    acc: dict[str, int] = {}
    for start, end, label in segments:
        acc[label] = acc.get(label, 0) + (end - start)
    return dict(sorted(acc.items(), key=lambda item: (-item[1], item[0])))


def labels_between(lane: Lane, start: int, end: int) -> dict[str, int]:
    """Label -> ns of the lane's timeline within [start, end] (what a critical-path step in this
    lane was made of); time outside the lane's window is not in it."""
    timeline = lane.timeline
    k = max(0, bisect.bisect_right(timeline, (start, _MAX, "")) - 1)
    acc: dict[str, int] = {}
    while k < len(timeline) and timeline[k][0] < end:
        a, b, label = timeline[k]
        overlap = min(b, end) - max(a, start)
        if overlap > 0:
            acc[label] = acc.get(label, 0) + overlap
        k += 1
    return acc


_MAX = 2**63


def _label(phase: str) -> str:
    return RENAMED.get(phase, phase)
