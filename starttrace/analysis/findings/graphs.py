"""`graph_capture` findings: CUDA-graph capture time, per batch size.

From `cuda_graphs.capture` spans (one per captured batch size: `starttrace.cuda_graphs.batch_size`,
`starttrace.cuda_graphs.memory_bytes`), else vLLM's own "Capture model" mark or our
`vllm.cuda_graphs.capture`. The cost is the slowest rank's capture time.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from starttrace.analysis.findings.common import by_pid, finding, s, short_name
from starttrace.analysis.model import RunModel
from starttrace.analysis.phases import union_by
from starttrace.analysis.table import span_table, spans_named

CAPTURE = "cuda_graphs.capture"
WHOLE = ("Capture model", "vllm.cuda_graphs.capture")
MIN_SECONDS = 1.0


def graph_capture_findings(model: RunModel) -> list[dict[str, Any]]:
    sizes = spans_named(
        model,
        (CAPTURE,),
        {"starttrace.cuda_graphs.batch_size": pl.Int64(), "starttrace.cuda_graphs.memory_bytes": pl.Int64()},
    )
    whole = span_table(model, WHOLE)
    both = pl.concat([sizes.select("lane", "start", "end"), whole.select("lane", "start", "end")])
    per_lane = {lane_index: ns / 1e9 for lane_index, ns in union_by(both, ["lane"]).iter_rows()}
    if not per_lane:
        return []
    worst_lane, seconds = max(per_lane.items(), key=lambda item: item[1])
    if seconds < MIN_SECONDS:
        return []
    mine = sizes.filter(pl.col("lane") == worst_lane)
    batch_sizes = sorted(set(mine["starttrace.cuda_graphs.batch_size"].drop_nulls().to_list()))
    memory = int(mine["starttrace.cuda_graphs.memory_bytes"].fill_null(0).sum())
    count = mine.height
    each = (
        f" ({count} sizes: {', '.join(map(str, batch_sizes[:12]))}{', ...' if len(batch_sizes) > 12 else ''})"
        if count
        else ""
    )
    mem = f", {memory / 2**20:.0f} MiB of graph memory" if memory else ""
    text = f"{short_name(model.lanes[worst_lane])} captured CUDA graphs for {s(seconds)}{each}{mem}"
    action = (
        "capture fewer batch sizes: --cudagraph-capture-sizes with the sizes you serve, or a smaller "
        "--max-cudagraph-capture-size; --enforce-eager skips capture altogether (slower decoding)"
    )
    return [
        finding(
            "graph_capture",
            "warning" if seconds >= 10 else "info",
            [model.lanes[i] for i in per_lane],
            seconds,
            text,
            action,
            sizes=count,
            batch_sizes=batch_sizes,
            memory_bytes=memory,
            seconds_per_rank=by_pid(model, per_lane),
        )
    ]
