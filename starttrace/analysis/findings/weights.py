"""`slow_weights` findings: weight files read slowly, against the other ranks and the page cache.

From the weights probe's `weights.load` spans (one per file: `starttrace.weights.file`,
`starttrace.weights.file_bytes`, `starttrace.weights.fs_type`, `starttrace.weights.page_cache_fraction`).
A rank's rate is the bytes of its files over the union of their spans. Reading from the page cache
runs at memory speed (GB/s); a rank far below the others, or below PAGE_CACHE_GBPS with cold files,
waits on its filesystem.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from starttrace.analysis.findings.common import by_pid, finding, s, short_name
from starttrace.analysis.model import RunModel
from starttrace.analysis.phases import union_by
from starttrace.analysis.table import spans_named

LOAD = "weights.load"
MIN_SECONDS = 1.0  # a rank whose weights took less has no finding
PAGE_CACHE_GBPS = 1.0  # well below what a read from the page cache reaches
SLOW_SHARE = 0.5  # a rank below half the fastest rank's rate is slow
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "ceph", "lustre", "gpfs", "9p", "fuse", "glusterfs", "beegfs")

_ATTRS = {
    "starttrace.weights.file": pl.String(),
    "starttrace.weights.file_bytes": pl.Int64(),
    "starttrace.weights.bytes_read": pl.Int64(),
    "starttrace.weights.fs_type": pl.String(),
    "starttrace.weights.page_cache_fraction": pl.Float64(),
}


def weight_facts(model: RunModel) -> list[dict[str, Any]]:
    """Per lane that read weight files: files, bytes, seconds (union of its loads), GB/s,
    filesystems, and the page-cache share of its bytes at open."""
    loads = spans_named(model, (LOAD,), _ATTRS)
    if loads.is_empty():
        return []
    loads = loads.with_columns(
        pl.coalesce("starttrace.weights.file_bytes", "starttrace.weights.bytes_read").fill_null(0).alias("bytes"),
    )
    out = []
    spans_ns = dict(union_by(loads.select("lane", "start", "end"), ["lane"]).iter_rows())
    for (lane_index,), part in loads.partition_by("lane", as_dict=True).items():
        seconds = spans_ns[lane_index] / 1e9
        total = int(part["bytes"].sum())
        cached = part.filter(pl.col("starttrace.weights.page_cache_fraction").is_not_null())
        cached_share = (
            float((cached["bytes"] * cached["starttrace.weights.page_cache_fraction"]).sum() / cached["bytes"].sum())
            if not cached.is_empty() and cached["bytes"].sum() > 0
            else None
        )
        out.append(
            {
                "lane": lane_index,
                "files": part.height,
                "bytes": total,
                "seconds": seconds,
                "gbps": (total / 1e9 / seconds) if seconds > 0 else None,
                "fs_types": sorted(set(part["starttrace.weights.fs_type"].drop_nulls().to_list())),
                "page_cache_share": cached_share,
            }
        )
    return sorted(out, key=lambda r: r["lane"])


def slow_weights_findings(model: RunModel) -> list[dict[str, Any]]:
    facts = [f for f in weight_facts(model) if f["gbps"] is not None]
    if not facts:
        return []
    fastest = max(f["gbps"] for f in facts)
    slow = [
        f
        for f in facts
        if f["seconds"] >= MIN_SECONDS and (f["gbps"] < PAGE_CACHE_GBPS or f["gbps"] < SLOW_SHARE * fastest)
    ]
    if not slow:
        return []
    worst = max(slow, key=lambda f: f["seconds"])
    lane = model.lanes[worst["lane"]]
    fs = sorted({t for f in slow for t in f["fs_types"]})
    fs_text = "/".join(fs) if fs else "an unknown filesystem"
    cache = worst["page_cache_share"]
    cache_text = "" if cache is None else f", {cache:.0%} of it in the page cache at open"
    text = (
        f"{short_name(lane)} read {worst['files']} weight file(s), {worst['bytes'] / 1e9:.2f} GB from {fs_text}, "
        f"in {s(worst['seconds'])}: {worst['gbps']:.2f} GB/s{cache_text}"
    )
    if len(facts) > 1:
        text += f"; the fastest rank reached {fastest:.2f} GB/s"
    network = any(t.startswith(NETWORK_FS) for t in fs)
    if cache is not None and cache >= 0.9:
        action = (
            "the files were already in the page cache, so the time is spent deserialising, not reading: use a "
            "faster loader (vLLM: --load-format fastsafetensors or runai_streamer) or fewer, larger shards"
        )
    elif network:
        action = (
            f"the weights come from {fs_text}: copy them to a local disk or /dev/shm before the start, prefetch "
            "them into the page cache, or stream them (vLLM: --load-format runai_streamer)"
        )
    else:
        action = (
            "prefetch the weight files into the page cache before the start (a local copy, or read them once), "
            "or stream them (vLLM: --load-format runai_streamer / fastsafetensors)"
        )
    return [
        finding(
            "slow_weights",
            "warning" if worst["seconds"] >= 10 else "info",
            [model.lanes[f["lane"]] for f in slow],
            worst["seconds"],
            text,
            action,
            gbps_per_rank=by_pid(model, {f["lane"]: f["gbps"] for f in facts}, digits=4),
            bytes=worst["bytes"],
            files=worst["files"],
            fs_types=fs,
            page_cache_share=None if cache is None else round(cache, 4),
        )
    ]
