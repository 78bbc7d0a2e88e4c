"""`cold_compile` findings: torch.compile graphs compiled from scratch (compile-cache misses).

From the compile probe's `compile.graph` spans (one per compiled graph: `starttrace.compile.cache`
hit or miss, `starttrace.compile.cache_dir`). The cost is each rank's exclusive `compile` time to
ready (its breakdown); the saving a warm cache gives is estimated as Inductor's compile
(`compile.inductor_compile`: codegen and C++ builds) inside the graphs that missed: Dynamo's
tracing and AOT autograd's capture run on every start, hit or miss.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from starttrace.analysis.findings.common import by_pid, finding, s, short_name
from starttrace.analysis.model import RunModel
from starttrace.analysis.phases import union_by
from starttrace.analysis.table import span_table, spans_named

GRAPH = "compile.graph"
AOT_LOAD = "compile.aot_load"  # vLLM's load of its AOT-compiled model; cache miss: the file failed to load
# the part of a compile a cache hit skips: Inductor's compile of the graph (codegen, C++ builds);
# Dynamo's tracing and AOT autograd's graph capture run on every start
BACKEND = ("compile.inductor_compile",)
MIN_COMPILE_S = 0.5

_ATTRS = {
    "starttrace.compile.cache": pl.String(),
    "starttrace.compile.cache_dir": pl.String(),
    "starttrace.compile.graphs": pl.Int64(),
}


def compile_facts(model: RunModel) -> pl.DataFrame:
    """Per lane with compiled graphs: graphs, misses, hits, cache dirs, and the backend seconds of
    the graphs that missed (`miss_backend_ns`: the union of the backend steps inside them)."""
    graphs = spans_named(model, (GRAPH,), _ATTRS)
    if graphs.is_empty():
        return graphs
    missed = graphs.filter(pl.col("starttrace.compile.cache") == "miss").select(
        "lane", pl.col("start").alias("g_start"), pl.col("end").alias("g_end")
    )
    backend = (
        span_table(model, BACKEND)
        .join(missed, on="lane", how="inner")  # a few graphs per lane: the pairs are few
        .filter((pl.col("start") >= pl.col("g_start")) & (pl.col("end") <= pl.col("g_end")))
        .select("lane", "start", "end")
        .unique()
    )
    saving = dict(union_by(backend, ["lane"]).iter_rows())
    return (
        graphs.group_by("lane")
        .agg(
            pl.col("starttrace.compile.graphs").fill_null(1).sum().alias("graphs"),
            (pl.col("starttrace.compile.cache") == "miss").sum().alias("misses"),
            (pl.col("starttrace.compile.cache") == "hit").sum().alias("hits"),
            # the caches the graphs were looked up in (not the ones of steps that asked no cache)
            pl.col("starttrace.compile.cache_dir")
            .filter(pl.col("starttrace.compile.cache").is_in(["hit", "miss"]))
            .drop_nulls()
            .unique()
            .sort()
            .alias("cache_dirs"),
        )
        .with_columns(
            pl.col("lane").replace_strict(saving, default=None, return_dtype=pl.Int64).alias("miss_backend_ns")
        )
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
        f"a warm cache would save about {s(predicted)} per rank (Inductor's compile of the graphs that missed)"
    )
    failed = aot_load_failures(model, {r["lane"] for r in rows})
    if failed:
        text += f"; vLLM found its AOT-compiled model in {', '.join(failed)} but could not load it, and compiled again"
    action = _keep_cache_action(dirs)
    if failed:
        action = (
            "vLLM's AOT compile cache failed to load (vLLM's log says why: 'Compiling model again due to a load "
            "failure'); until that is fixed, VLLM_USE_AOT_COMPILE=0 makes vLLM use Inductor's FX graph cache "
            "(TORCHINDUCTOR_CACHE_DIR); and " + action
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
            compile_s_per_rank=by_pid(model, per_rank),
            predicted_saving_s=round(predicted, 6),
            aot_load_failures=failed,
        )
    ]


def _keep_cache_action(dirs: list[str]) -> str:
    """Keep the cache the misses were in: vLLM's artifact cache lives under VLLM_CACHE_ROOT
    (`.../torch_compile_cache/...`), Inductor's FX graph cache in TORCHINDUCTOR_CACHE_DIR (by default
    /tmp/torchinductor_<user>: gone with the container, or at reboot)."""
    keep = ", ".join(dirs) if dirs else "the compile cache directory"
    if any("torch_compile_cache" in d for d in dirs):
        return (
            f"keep {keep} across starts: put VLLM_CACHE_ROOT on a persistent volume (or bake a warmed cache into "
            "the image), so the next start loads the compiled graphs instead of compiling them"
        )
    return (
        f"keep {keep} across starts: set TORCHINDUCTOR_CACHE_DIR to a persistent volume (the default "
        "/tmp/torchinductor_<user> is lost with the container or at reboot), or pre-warm it in the image"
    )


def aot_load_failures(model: RunModel, lanes: set[int]) -> list[str]:
    """The cache directories of vLLM AOT-compiled models that were there but failed to load
    (`compile.aot_load` with cache `miss`) in these lanes."""
    spans = spans_named(
        model, (AOT_LOAD,), {"starttrace.compile.cache": pl.String(), "starttrace.compile.cache_dir": pl.String()}
    )
    failed = spans.filter(pl.col("lane").is_in(list(lanes)) & (pl.col("starttrace.compile.cache") == "miss"))
    return sorted({str(d) for d in failed["starttrace.compile.cache_dir"].to_list() if d})
