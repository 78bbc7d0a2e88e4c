"""A run's start kind and fingerprint: what makes two starts comparable.

`start_kind` says in which state the caches were (compile cache, page cache, the startup plan) and
where the weights came from; `fingerprint` says on what (hardware), with what (software) and how
(vLLM's configuration) the server started. Both come from what the probes record (docs/fleet.md,
"Start kind and fingerprint", field by field); a value nothing recorded is "none" (kind) or left
out (fingerprint). Fleets compare runs only within one kind; `compare` names kind and fingerprint
differences as the first causes, and its gate refuses unlike pairs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import polars as pl

from starttrace.analysis.model import RunModel
from starttrace.analysis.table import spans_named
from starttrace.run import Run

# the start-kind keys, in the order causes name them
KIND_KEYS = ("compile_cache", "page_cache", "weights_source", "weights_fs", "plan_cache")
UNKNOWN = "unknown"  # a facts row derived before start kinds existed
WARM_PAGE_CACHE = 0.9  # this share of the weights' bytes in the page cache at open or more: warm
COLD_PAGE_CACHE = 0.1  # this share or less: cold

# fingerprint key -> the span attributes it is read from, first found wins
HARDWARE = {
    "cpu.model": ("starttrace.host.cpu_model",),
    "cpu.count": ("starttrace.host.cpu_count",),
    "gpu.model": ("starttrace.cuda.device_name",),
    "gpu.count": ("starttrace.cuda.device_count",),
}
SOFTWARE = {
    "python": ("starttrace.python.version",),
    "torch": ("starttrace.torch.version",),
    "vllm": ("starttrace.vllm.version",),
    "cuda": ("starttrace.cuda.version",),
}
CONFIG = {
    "model": ("vllm.model",),
    "dtype": ("vllm.dtype",),
    "tp": ("vllm.tensor_parallel_size",),
    "pp": ("vllm.pipeline_parallel_size",),
    "dp": ("vllm.data_parallel_size",),
    "max_model_len": ("vllm.max_model_len",),
    "compile_mode": ("vllm.compile_mode",),
    "enforce_eager": ("vllm.enforce_eager",),
    "cudagraph_sizes": ("vllm.cudagraph_sizes",),
}
FINGERPRINT_GROUPS = {"hardware": HARDWARE, "software": SOFTWARE, "config": CONFIG}
# the spans that carry them: vLLM's config and model load (probes/vllm.py), CUDA's init (probes/torch.py)
FACT_SPANS = ("vllm.create_engine_config", "vllm.model_load", "cuda.init", "vllm.startup_plan.load")

COMPILE_SPANS = ("compile.graph", "compile.aot_load")
WEIGHT_SPANS = ("weights.load",)


def start_kind(run: Run | None, model: RunModel) -> dict[str, str]:
    """The run's start kind: each of KIND_KEYS -> its value (docs/fleet.md)."""
    if not model.spans.height:
        return dict.fromkeys(KIND_KEYS, "none")
    source, fs = _weights_source(model)
    return {
        "compile_cache": _compile_cache(model),
        "page_cache": _page_cache(model),
        "weights_source": source,
        "weights_fs": fs,
        "plan_cache": _plan_cache(model),
    }


def fingerprint(run: Run | None, model: RunModel) -> dict[str, str]:
    """The run's hardware, software and configuration: `group.key` -> value, for what was recorded."""
    attrs = _fact_attrs(model) if model.spans.height else {}
    out: dict[str, str] = {}
    for group, fields in FINGERPRINT_GROUPS.items():
        for key, sources in fields.items():
            value = next((attrs[s] for s in sources if attrs.get(s) not in (None, "")), None)
            if value is not None:
                out[f"{group}.{key}"] = _text(value)
    if "software.vllm" not in out:
        version = _root_resource(run, model).get("service.version")
        if model.service == "vllm" and version not in (None, ""):
            out["software.vllm"] = str(version)
    return out


def kind_of(facts: dict[str, Any]) -> dict[str, str]:
    """A facts row's start kind, every key present ("unknown" in rows derived before kinds existed)."""
    got = facts.get("kind") or {}
    return {key: str(got.get(key, UNKNOWN)) for key in KIND_KEYS}


def kind_label(kind: dict[str, str], keys: Iterable[str] = KIND_KEYS) -> str:
    """`compile_cache=cold, page_cache=warm, ...`: one kind as text (a group or regression names it)."""
    return ", ".join(f"{k}={kind[k]}" for k in keys if k in kind)


def _compile_cache(model: RunModel) -> str:
    spans = spans_named(model, COMPILE_SPANS, {"starttrace.compile.cache": pl.String()})
    verdicts = spans["starttrace.compile.cache"].drop_nulls().to_list() if spans.height else []
    hits = sum(1 for v in verdicts if v == "hit")
    misses = sum(1 for v in verdicts if v == "miss")
    if not hits and not misses:
        return "none"
    if not misses:
        return "warm"
    return "cold" if not hits else "partial"


def _page_cache(model: RunModel) -> str:
    loads = spans_named(
        model,
        WEIGHT_SPANS,
        {"starttrace.weights.file_bytes": pl.Int64(), "starttrace.weights.page_cache_fraction": pl.Float64()},
    )
    if not loads.height:
        return "none"
    known = loads.filter(pl.col("starttrace.weights.page_cache_fraction").is_not_null())
    if not known.height:
        return "none"
    weight = known["starttrace.weights.file_bytes"].fill_null(1).cast(pl.Float64)
    total = float(weight.sum())
    share = float((weight * known["starttrace.weights.page_cache_fraction"]).sum() / total) if total > 0 else 0.0
    if share >= WARM_PAGE_CACHE:
        return "warm"
    return "cold" if share <= COLD_PAGE_CACHE else "partial"


def _weights_source(model: RunModel) -> tuple[str, str]:
    """(local / download / none, the filesystems the weights were read from, comma-separated)."""
    loads = spans_named(
        model, WEIGHT_SPANS, {"starttrace.weights.format": pl.String(), "starttrace.weights.fs_type": pl.String()}
    )
    if not loads.height:
        return "none", "none"
    fs = ",".join(sorted(set(loads["starttrace.weights.fs_type"].drop_nulls().to_list()))) or "none"
    source = "download" if "download" in loads["starttrace.weights.format"].to_list() else "local"
    return source, fs


def _plan_cache(model: RunModel) -> str:
    """vLLM's startup plan (VLLM_ENABLE_STARTUP_PLAN=1): hit when every lookup found a plan."""
    spans = spans_named(model, ("vllm.startup_plan.load",), {"vllm.startup_plan": pl.String()})
    verdicts = set(spans["vllm.startup_plan"].drop_nulls().to_list()) if spans.height else set()
    if not verdicts:
        return "none"
    if verdicts == {"hit"}:
        return "hit"
    return "miss" if verdicts == {"miss"} else "partial"


def _fact_attrs(model: RunModel) -> dict[str, Any]:
    """The attributes of the few spans that carry hardware, software and configuration facts."""
    out: dict[str, Any] = {}
    for node in model.select(names=FACT_SPANS):
        for key, value in node.attrs.items():
            if key not in out and value not in (None, ""):
                out[key] = value
    return out


def _root_resource(run: Run | None, model: RunModel) -> dict[str, Any]:
    """The root process's resource (the run's, else the model's lanes')."""
    if run is not None:
        resources = [p.resource for p in run.processes]
        starts = [r.get("starttrace.start_method") for r in resources]
    else:
        resources = [lane.resource for lane in model.lanes]
        starts = [lane.start_method for lane in model.lanes]
    ranked = sorted(zip(starts, resources, strict=True), key=lambda item: item[0] != "root")
    return dict(ranked[0][1]) if ranked else {}


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)
