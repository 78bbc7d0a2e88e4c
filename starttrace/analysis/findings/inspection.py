"""`cold_model_inspection`: the API server waited for vLLM's model inspection helper.

vLLM inspects the model class in a subprocess (`python -m vllm.model_executor.models.registry`,
from `create_engine_config`: no CUDA in the API server) and keeps the result in
`$VLLM_CACHE_ROOT/modelinfos`, keyed by the model module's hash. With the cache empty the helper
imports vLLM's model code (7-17 s on CPU) while the API server waits; with the cache kept it
imports nothing. The finding names that wait when the helper's imports are on the critical path;
its saving is those imports (analysis.plan).
"""

from __future__ import annotations

from typing import Any

from starttrace.analysis.critical_path import path_by_lane
from starttrace.analysis.findings.common import finding, launcher_lane, s
from starttrace.analysis.model import RunModel
from starttrace.analysis.vllm_lanes import INSPECTION_MODULE, inspection_helpers

MIN_IMPORT_S = 1.0  # a helper that imported less than this is not worth a finding


def inspection_findings(model: RunModel) -> list[dict[str, Any]]:
    on_path = dict(path_by_lane(model.critical_path))
    out = []
    for lane in inspection_helpers(model):
        imports = lane.breakdown.get("import", 0) / 1e9
        path_s = on_path.get(lane.index, 0) / 1e9
        if imports < MIN_IMPORT_S or path_s <= 0:
            continue
        waiter = launcher_lane(model, lane)
        who = waiter.label if waiter is not None else "its parent"
        top = lane.top_imports[0] if lane.top_imports else None
        biggest = f" ({top[0]} {s(top[1] / 1e9)})" if top else ""
        text = (
            f"{who} waited {s(path_s)} for vLLM's model inspection helper ({lane.label}: python -m "
            f"{INSPECTION_MODULE}), {s(imports)} of it importing{biggest}: vLLM's cache of the inspection, "
            "$VLLM_CACHE_ROOT/modelinfos, was empty"
        )
        action = (
            "keep VLLM_CACHE_ROOT across starts (its modelinfos folder holds the inspection; with it the helper "
            "imports nothing): put it on a persistent volume, or bake a warmed one into the image"
        )
        out.append(
            finding(
                "cold_model_inspection",
                "warning" if path_s >= 5 else "info",
                [lane] + ([waiter] if waiter is not None else []),
                path_s,
                text,
                action,
                helper_lane=lane.index,
                helper_pid=lane.pid,
                import_s=round(imports, 6),
                critical_path_s=round(path_s, 6),
            )
        )
    return out
