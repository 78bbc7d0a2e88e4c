"""Spans with implausible times (e.g. `start_time_unix_nano=0` from a broken exporter) would
stretch a run over decades: a span more than WINDOW_NS from the run's reference time (the median
of its processes' latest span starts) is left out of the run and named in its `problems`.
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from starttrace.run import Run

WINDOW_NS = 7 * 86400 * 10**9  # a startup (or a watched live run) lasts far less than a week


def _when(ns: int) -> str:
    try:
        return dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return f"{ns} ns"


def _problem(label: str, n: int, name: str, start: int, end: int | None, ref: int) -> str:
    at = start if abs(start - ref) > WINDOW_NS else end or start  # the time that is out of the window
    return (
        f"{label}: {n} span{'s' if n > 1 else ''} with implausible times left out"
        f" (e.g. {name[:80]!r} at {_when(at)}; the run's spans are around {_when(ref)})"
    )


def drop_implausible(run: Run) -> None:
    """Drop the spans of `run` whose times lie outside its window; say so in `run.problems`. The
    run's span table is read in its order (lane by lane, each by start): a lane's first span out of
    the window is the one named."""
    spans = run.spans
    if not spans.height:
        return
    latest = sorted(spans.group_by("lane").agg(pl.col("start").max()).get_column("start").to_list())
    ref = latest[len(latest) // 2]
    lo, hi = ref - WINDOW_NS, ref + WINDOW_NS
    outside = (pl.col("start") < lo) | (pl.col("start") > hi) | (pl.col("end") > hi).fill_null(False)
    bad = spans.filter(outside)
    if bad.height:
        firsts = {
            lane: (n, name, start, end)
            for lane, n, name, start, end in bad.group_by("lane", maintain_order=True)
            .agg(pl.len(), pl.col("name").first(), pl.col("start").first(), pl.col("end").first())
            .iter_rows()
        }
        for p in run.processes:
            got = firsts.get(p.instance_id)
            if got is not None:
                run.problems.append(_problem(p.label(), *got, ref))
        run.spans = spans.filter(~outside)
    roots = run.root_spans
    wrong = [s for s in roots if not (lo <= s.start_ns <= hi) or (s.end_ns is not None and s.end_ns > hi)]
    if wrong:
        keep = {id(s) for s in wrong}
        roots[:] = [s for s in roots if id(s) not in keep]
        first = wrong[0]
        run.problems.append(_problem("the run", len(wrong), first.name, first.start_ns, first.end_ns, ref))
