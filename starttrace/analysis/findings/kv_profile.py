"""`kv_profile` findings: the memory profile run vLLM makes on every start to size the KV cache.

The cost is each rank's exclusive `kv_cache` time to ready (its breakdown: the profile run's own
time, not the compile that runs inside it, which `cold_compile` reports), with the bytes vLLM found
(`vllm.kv_cache.available_bytes` on `vllm.kv_cache.profile`).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from starttrace.analysis.findings.common import by_pid, finding, s, short_name
from starttrace.analysis.model import RunModel
from starttrace.analysis.table import spans_named

PROFILE = ("vllm.kv_cache.profile", "vllm.kv_cache.profile_run")
MIN_SECONDS = 1.0


def kv_profile_findings(model: RunModel) -> list[dict[str, Any]]:
    spans = spans_named(model, PROFILE, {"vllm.kv_cache.available_bytes": pl.Int64()})
    if spans.is_empty():
        return []
    lanes = sorted(set(spans["lane"].to_list()))
    per_lane = {i: model.lanes[i].breakdown.get("kv_cache", 0) / 1e9 for i in lanes}
    worst, seconds = max(per_lane.items(), key=lambda item: item[1])
    if seconds < MIN_SECONDS:
        return []
    found = spans["vllm.kv_cache.available_bytes"].drop_nulls()
    found_bytes = int(found.min()) if not found.is_empty() else None
    got = f"; it found {found_bytes / 2**30:.2f} GiB for the KV cache" if found_bytes else ""
    text = (
        f"{short_name(model.lanes[worst])} spent {s(seconds)} in the KV-cache phase (the memory profile run "
        f"that sizes the KV cache, and its allocation){got}"
    )
    size = f" {found_bytes}" if found_bytes else " <bytes found by this run>"
    action = (
        "skip the profiling on later starts: VLLM_ENABLE_STARTUP_PLAN=1 (vLLM 0.32+ keeps the size it found), "
        f"or --kv-cache-memory-bytes{size}; on CPU, VLLM_CPU_KVCACHE_SPACE sets the size"
    )
    return [
        finding(
            "kv_profile",
            "warning" if seconds >= 10 else "info",
            [model.lanes[i] for i in lanes],
            seconds,
            text,
            action,
            available_bytes=found_bytes,
            seconds_per_rank=by_pid(model, per_lane),
        )
    ]
