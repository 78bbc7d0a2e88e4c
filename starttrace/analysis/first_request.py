"""The run's first served request (phase `first_request`, probes/first_request.py): when its first
token was sent, how long the request took, which processes worked on it, and the lazy work inside
it (compile, graph capture, weights, imports, tokenizer: spans of those phases inside a
`first_request` span keep their own phase). Pure: reads the model's span table."""

from __future__ import annotations

from typing import Any

import polars as pl

from starttrace.analysis.model import STRUCTURAL_PHASES, RunModel
from starttrace.analysis.phases import union_by

PHASE = "first_request"
REQUEST_SPAN = "server.first_request"
# phases that are not lazy work when inside the request: the request's own parts, waits, loops
NOT_LAZY = (PHASE, "idle", "wait", "ready", *STRUCTURAL_PHASES)


def first_request_summary(model: RunModel) -> dict[str, Any] | None:
    """`{time_to_first_token_s, request_start_s, ready_to_request_s, request_s, lanes, lazy, lazy_s}`
    (seconds; `request_s` from the request's arrival to its first token), or None when the run
    served no request."""
    table = model.core
    parts = table.filter((pl.col("phase") == PHASE) & ~pl.col("instant"))
    if parts.is_empty() and model.first_token_ns is None:
        return None
    server = parts.filter(pl.col("name") == REQUEST_SPAN)
    start = int((server if server.height else parts)["start"].min()) if parts.height else model.first_token_ns
    token = model.first_token_ns
    per_lane = union_by(parts.select("lane", "start", "eff_end"), ["lane"], "start", "eff_end")
    lanes = [
        {"lane": lane, "label": model.lanes[lane].label, "seconds": round(ns / 1e9, 6)}
        for lane, ns in per_lane.iter_rows()
    ]
    lazy, lazy_ns = _lazy_work(model, parts)
    return {
        "time_to_first_token_s": model.time_to_first_token_s,
        "request_start_s": model.seconds(start),
        "ready_to_request_s": None
        if model.ready_ns is None or start is None
        else round(max(0, start - model.ready_ns) / 1e9, 6),
        "request_s": None if token is None or start is None else round(max(0, token - start) / 1e9, 6),
        "lanes": lanes,
        "lazy": lazy,
        "lazy_s": round(lazy_ns / 1e9, 6),
    }


def _lazy_work(model: RunModel, parts: pl.DataFrame) -> tuple[dict[str, float], int]:
    """Phase -> seconds of the work of other phases inside the first request's spans (the slowest
    lane's, per phase: ranks work in parallel), and the slowest lane's lazy time over all phases."""
    if parts.is_empty():
        return {}, 0
    windows = parts.select("lane", pl.col("start").alias("w_start"), pl.col("eff_end").alias("w_end"))
    inside = (
        model.core.lazy()
        .filter(~pl.col("instant") & ~pl.col("phase").is_in(list(NOT_LAZY)))
        .select("lane", "phase", "start", "eff_end")
        .join(windows.lazy(), on="lane", how="inner")
        .with_columns(
            pl.max_horizontal("start", "w_start").alias("s"), pl.min_horizontal("eff_end", "w_end").alias("e")
        )
        .filter(pl.col("e") > pl.col("s"))
        .select("lane", "phase", "s", "e")
        .collect()
    )
    if inside.is_empty():
        return {}, 0
    by_phase: dict[str, int] = {}
    for _lane, phase, ns in union_by(inside, ["lane", "phase"], "s", "e").iter_rows():
        by_phase[phase] = max(by_phase.get(phase, 0), ns)
    total = int(union_by(inside, ["lane"], "s", "e")["ns"].max() or 0)
    lazy = {k: round(v / 1e9, 6) for k, v in sorted(by_phase.items(), key=lambda kv: -kv[1])}
    return lazy, total
