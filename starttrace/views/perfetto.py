"""A run as Chrome/Perfetto trace-event JSON (ui.perfetto.dev or chrome://tracing): one track per
process, sorted like the waterfall. Slices on one thread obey Perfetto's nesting rule: a child that
outlives its parent is clipped to it, the clip recorded in its args.
"""

from __future__ import annotations

import math
import time
from typing import Any

from starttrace.analysis.detail import DEFAULT_DETAIL, DEFAULT_IMPORT_BUDGET, apply_detail
from starttrace.run import Process, Run, Span, span_of
from starttrace.views.json import attr_text

ROLE_ORDER = {"main": 0, "api_server": 1, "forkserver": 2, "engine_core": 3, "worker": 4, "helper": 5}
RUN_TRACK_PID = 0


def sort_key(process: Process) -> tuple[int, int, int]:
    rank = process.rank if process.rank is not None else 1 << 20
    return ROLE_ORDER.get(process.role, 6), rank, process.created_ns


def lane_rows(run: Run) -> dict[str, list[dict[str, Any]]]:
    """The rows of the run's span table per lane (`iter_rows(named=True)`), in table order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in run.spans.iter_rows(named=True):
        out.setdefault(row["lane"], []).append(row)
    return out


def _us(ns: int, t0: int) -> float:
    return round((ns - t0) / 1000.0, 3)


def to_perfetto(
    run: Run, now_ns: int | None = None, detail: str = DEFAULT_DETAIL, import_budget: int = DEFAULT_IMPORT_BUDGET
) -> dict[str, Any]:
    now_ns = time.time_ns() if now_ns is None else now_ns
    run = apply_detail(run, detail, import_budget)
    starts = [p.created_ns for p in run.processes] + [s.start_ns for s in run.root_spans]
    t0 = min(starts) if starts else 0
    events: list[dict[str, Any]] = []
    events.append({"ph": "M", "name": "process_name", "pid": RUN_TRACK_PID, "args": {"name": f"run {run.run_id}"}})
    events.append({"ph": "M", "name": "process_sort_index", "pid": RUN_TRACK_PID, "args": {"sort_index": 0}})
    for span in run.root_spans:
        events.extend(_slices([span], RUN_TRACK_PID, t0, now_ns))
    used: set[int] = set()
    by_lane = lane_rows(run)
    several_hosts = len({p.clock_domain for p in run.processes}) > 1  # name each track's host too
    for index, process in enumerate(sorted(run.processes, key=sort_key), 1):
        pid = process.pid or 1_000_000 + index  # OTLP processes may carry no pid
        if pid in used:  # the same pid on another host of a multi-node run: a track of its own
            pid = 1_000_000 + index
        used.add(pid)
        name = f"{process.label()} @ {process.host}" if several_hosts else process.label()
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": index}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": pid, "args": {"name": "main"}})
        events.extend(_slices([span_of(row) for row in by_lane.get(process.instance_id, ())], pid, t0, now_ns))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "metadata": {"starttrace.run_id": run.run_id, "trace_id": run.trace_id, "epoch_origin_ns": t0},
    }


def _slices(spans: list[Span], pid: int, t0: int, now_ns: int) -> list[dict[str, Any]]:
    by_thread: dict[int, list[Span]] = {}
    for span in spans:
        by_thread.setdefault(span.thread or pid, []).append(span)
    events: list[dict[str, Any]] = []
    for tid, thread_spans in by_thread.items():
        if tid != pid:
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"thread {tid}"}})
        ends = {s.span_id: _end(s, now_ns) for s in thread_spans}
        ordered = sorted(thread_spans, key=lambda s: (s.start_ns, -ends[s.span_id]))
        stack: list[int] = []  # end times of the open slices
        for span in ordered:
            start, end = span.start_ns, ends[span.span_id]
            while stack and stack[-1] <= start:
                stack.pop()
            args: dict[str, Any] = {k: _arg(v) for k, v in span.attrs.items()}
            args["span_id"] = span.span_id
            if span.error is not None:
                args["error"] = span.error
            if span.open:
                args["in_progress"] = True
            if span.instant:
                events.append(
                    {"ph": "i", "s": "p", "name": span.name, "pid": pid, "tid": tid, "ts": _us(start, t0), "args": args}
                )
                continue
            if stack and end > stack[-1]:
                args["clipped_to_parent_ns"] = end - stack[-1]
                end = stack[-1]
            category = str(span.attrs.get("starttrace.phase", "other"))
            events.append(
                {
                    "ph": "X",
                    "name": span.name,
                    "cat": category,
                    "pid": pid,
                    "tid": tid,
                    "ts": _us(start, t0),
                    "dur": round((end - start) / 1000.0, 3),
                    "args": args,
                }
            )
            stack.append(end)
    return events


def _end(span: Span, now_ns: int) -> int:
    if not span.open and span.end_ns is not None:
        return span.end_ns
    return max(now_ns if span.end_ns is None else span.end_ns, span.start_ns)


def _arg(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return attr_text(value)  # NaN or an infinity: its text (strict JSON has no such number)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_arg(v) for v in value]
    return str(value)
