"""Spans with implausible times: flagged in the run's `problems` and left out of the run.

A span whose start (or end) lies far outside the run's window, e.g. `start_time_unix_nano=0` from
a broken exporter (1970), would stretch the run over decades: its startup, every metric and the
waterfall's scale. The run's reference time is the median of its processes' latest span starts;
a span more than WINDOW_NS before or after it is dropped from the run handed to the analysis
(so no view or metric counts it) and named, with how many, in `problems`. A process's spans are
sorted by start, so a process with nothing out of the window costs two comparisons and one pass
over its ends.
"""

from __future__ import annotations

import datetime as dt
import operator

from starttrace.run import Run, Span

WINDOW_NS = 7 * 86400 * 10**9  # a startup (or a watched live run) lasts far less than a week

_END = operator.attrgetter("end_ns")


def _when(ns: int) -> str:
    try:
        return dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return f"{ns} ns"


def drop_implausible(run: Run) -> None:
    """Drop the spans of `run` whose times lie outside its window; say so in `run.problems`."""
    latest = sorted(p.spans[-1].start_ns for p in run.processes if p.spans)
    if not latest:
        return
    ref = latest[len(latest) // 2]
    lo, hi = ref - WINDOW_NS, ref + WINDOW_NS
    groups: list[tuple[str, list[Span], bool]] = [(p.label(), p.spans, True) for p in run.processes]
    groups.append(("the run", run.root_spans, False))
    for label, spans, is_process in groups:
        if not spans:
            continue
        if is_process and spans[0].start_ns >= lo and spans[-1].start_ns <= hi:
            if max(filter(None, map(_END, spans)), default=0) <= hi:
                continue
        bad = [s for s in spans if not (lo <= s.start_ns <= hi) or (s.end_ns is not None and s.end_ns > hi)]
        if not bad:
            continue
        keep = {id(s) for s in bad}
        spans[:] = [s for s in spans if id(s) not in keep]
        first = bad[0]
        at = first.start_ns if not lo <= first.start_ns <= hi else first.end_ns or first.start_ns
        run.problems.append(
            f"{label}: {len(bad)} span{'s' if len(bad) > 1 else ''} with implausible times left out"
            f" (e.g. {first.name[:80]!r} at {_when(at)}; the run's spans are around {_when(ref)})"
        )
