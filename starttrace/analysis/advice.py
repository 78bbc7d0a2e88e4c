"""Deprecated: the preload advice and the CUDA-clean audit now live in `analysis.findings`
(`findings.preload`, `findings.cuda`); these names stay for older imports."""

from __future__ import annotations

from typing import Any

from starttrace.analysis.findings import cuda_audit, find_all, preload_advice_rows
from starttrace.analysis.model import RunModel

__all__ = ["cuda_audit", "preload_advice"]


def preload_advice(model: RunModel) -> list[dict[str, Any]]:
    """Per-module rows of the model's `preload` findings (see `findings.preload_advice_rows`)."""
    return preload_advice_rows(model.findings or find_all(model))
