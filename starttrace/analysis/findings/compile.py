"""`cold_compile` findings: torch.compile graphs compiled from scratch (compile-cache misses).

From the compile probe's `compile.graph` spans (one per compiled graph: `starttrace.compile.cache`
hit or miss, `starttrace.compile.cache_dir`). The cost is each rank's exclusive `compile` time to
ready (its breakdown); the saving a warm cache gives is estimated as the backend (AOT autograd and
Inductor) time of the graphs that missed: Dynamo's tracing runs on every start, hit or miss.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from starttrace.analysis.findings.common import finding, s, short_name
from starttrace.analysis.model import RunModel
from starttrace.analysis.table import span_table, spans_named

GRAPH = "compile.graph"
# the part of a compile a cache hit skips: the backend's compile (AOT autograd + Inductor)
BACKEND = ("compile.backend_compile", "compile.inductor_compile")
MIN_COMPILE_S = 0.5

_ATTRS = {
    "starttrace.compile.cache": pl.String(),
    "starttrace.compile.cache_dir": pl.String(),
    "starttrace.compile.graphs": pl.Int64(),
}


def compile_facts(model: RunModel) -> pl.DataFrame:
    """Per lane with compiled graphs: graphs, misses, hits, cache dirs, and the backend seconds of
    the graphs that missed (`miss_backend_ns`)."""
    graphs = spans_named(model, (GRAPH,), _ATTRS)
    if graphs.is_empty():
        return graphs
    table = span_table(model)
    backend = (
        table.filter(pl.col("name").is_in(list(BACKEND)))
        .join(graphs.select(pl.col("idx").alias("parent"), "starttrace.compile.cache"), on="parent", how="inner")
        .filter(pl.col("starttrace.compile.cache") == "miss")
        .group_by("lane")
        .agg((pl.col("end") - pl.col("start")).max().alias("longest"), (pl.col("end") - pl.col("start")).sum())
    )
    return (
        graphs.group_by("lane")
        .agg(
            pl.col("starttrace.compile.graphs").fill_null(1).sum().alias("graphs"),
            (pl.col("starttrace.compile.cache") == "miss").sum().alias("misses"),
            (pl.col("starttrace.compile.cache") == "hit").sum().alias("hits"),
            pl.col("starttrace.compile.cache_dir").drop_nulls().unique().sort().alias("cache_dirs"),
        )
        .join(backend.select("lane", pl.col("longest").alias("miss_backend_ns")), on="lane", how="left")
        .sort("lane")
    )


def cold_compile_findings(model: RunModel) -> list[dict[str, Any]]:
    facts = compile_facts(model)
    if facts.is_empty():
        return []
    cold = facts.filter(pl.col("misses") > 0)
    if cold.is_empty():
        return []
    rows = cold.to_dicts()
    lanes = [model.lanes[r["lane"]] for r in rows]
    per_rank = {r["lane"]: model.lanes[r["lane"]].breakdown.get("compile", 0) / 1e9 for r in rows}
    slowest = max(per_rank.values())
    if slowest < MIN_COMPILE_S:
        return []
    dirs = sorted({d for r in rows for d in r["cache_dirs"]})
    misses = sum(r["misses"] for r in rows)
    graphs = sum(r["graphs"] for r in rows)
    predicted = max(((r["miss_backend_ns"] or 0) / 1e9 for r in rows), default=0.0)
    worst = max(rows, key=lambda r: per_rank[r["lane"]])
    where = f" in {', '.join(dirs)}" if dirs else ""
    text = (
        f"torch.compile compiled {graphs} graph(s) with {misses} compile-cache miss(es){where}: "
        f"{s(slowest)} of compile on the slowest rank ({short_name(model.lanes[worst['lane']])}); "
        f"a warm cache would save about {s(predicted)} per rank (the backend compile of the graphs that missed)"
    )
    vllm = any(ln.role in ("worker", "engine_core") for ln in lanes)
    keep = dirs[0] if dirs else "the compile cache directory"
    if vllm:
        action = (
            f"keep {keep} across starts: put VLLM_CACHE_ROOT on a persistent volume (or bake a warmed cache into "
            "the image), so the next start loads the compiled graphs instead of compiling them"
        )
    else:
        action = (
            f"keep {keep} across starts (TORCHINDUCTOR_CACHE_DIR on a persistent volume, or pre-warm it in the image)"
        )
    return [
        finding(
            "cold_compile",
            "warning" if slowest >= 5 else "info",
            lanes,
            slowest,
            text,
            action,
            graphs=graphs,
            cache_misses=misses,
            cache_dirs=dirs,
            compile_s_per_rank={str(model.lanes[k].pid): round(v, 6) for k, v in per_rank.items()},
            predicted_saving_s=round(predicted, 6),
        )
    ]
