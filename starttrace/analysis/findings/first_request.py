"""`lazy_first_request`: the first request did work a steady request does not (docs/findings.md).

The run records one request, so a steady request's cost is estimated as the first request less its
lazy work (compile, graph capture, weights, imports, tokenizer inside `first_request` spans:
analysis/first_request.py). The finding fires when the lazy work is at least MIN_SECONDS and the
first request took at least RATIO times that estimate.
"""

from __future__ import annotations

from typing import Any

from starttrace.analysis.findings.common import finding, s
from starttrace.analysis.first_request import first_request_summary
from starttrace.analysis.model import RunModel

MIN_SECONDS = 0.5
RATIO = 2.0
# what to warm up per lazy phase, with vLLM's own options where it has them (vLLM 0.32)
WARM_UP = {
    "compile": (
        "compile the shapes you serve during startup: vLLM compiles the sizes in "
        "--compilation-config '{\"compile_sizes\": [...]}' in its warm-up, and a compile cache kept "
        "between starts (VLLM_CACHE_ROOT) loads them instead of compiling"
    ),
    "cuda_graphs": (
        "capture the batch sizes you serve during startup (--cudagraph-capture-sizes), or serve "
        "eager (--enforce-eager) when capture costs more than it saves"
    ),
    "import": "import these modules at startup (the preload findings name them), not on the first request",
    "tokenizer": "load the tokenizer at startup (do not pass --skip-tokenizer-init when you serve text)",
    "model_load": "load every weight at startup (no on-demand or lazy loading of the model's weights)",
}
GENERIC = "send one warm-up request before the server reports ready (e.g. a readiness probe that completes a token)"


def lazy_first_request_findings(model: RunModel) -> list[dict[str, Any]]:
    summary = first_request_summary(model)
    if summary is None or summary["request_s"] is None:
        return []
    lazy_s, request_s = summary["lazy_s"], summary["request_s"]
    steady_s = max(0.0, request_s - lazy_s)
    if lazy_s < MIN_SECONDS or request_s < RATIO * steady_s:
        return []
    lazy: dict[str, float] = summary["lazy"]
    named = ", ".join(f"{phase} {s(secs)}" for phase, secs in lazy.items())
    text = (
        f"the first request took {s(request_s)} to its first token, about {s(steady_s)} of it the request itself:"
        f" {s(lazy_s)} was lazy work after ready ({named})"
    )
    actions = [WARM_UP[phase] for phase in lazy if phase in WARM_UP]
    action = "; ".join([*actions, GENERIC])
    lanes = [model.lanes[row["lane"]] for row in summary["lanes"]]
    return [
        finding(
            "lazy_first_request",
            "warning" if lazy_s >= 5 else "info",
            lanes,
            lazy_s,
            text,
            action,
            request_s=request_s,
            steady_estimate_s=round(steady_s, 6),
            lazy=lazy,
        )
    ]
