"""vLLM's own helper processes, told apart by their command line (the inspection finding and the plan
both need them; kept outside findings/ so that the plan, which findings/ calls, imports no finding)."""

from __future__ import annotations

from starttrace.analysis.model import Lane, RunModel

INSPECTION_MODULE = "vllm.model_executor.models.registry"  # `python -m` of vLLM's model inspection helper


def inspection_helpers(model: RunModel) -> list[Lane]:
    """The lanes of vLLM's model inspection helper (by its command line)."""
    return [lane for lane in model.lanes if INSPECTION_MODULE in (lane.command or "") and not lane.after_ready]
