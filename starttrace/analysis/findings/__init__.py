"""Findings: what the analysis concludes about a run, each `{kind, severity, pids, lanes,
seconds, text, action}` plus kind-specific keys (docs/findings.md).

Kinds: `stalled` (live runs), `cuda_before_fork`, `unused_forkserver`, `preload`, `straggler`,
`cold_compile`, `cold_model_inspection`, `slow_weights`, `graph_capture`, `kv_profile`,
`lazy_first_request`, and the multi-node ones.
Every view (JSON, page, terminal, `starttrace advise`) shows this same list, most severe first,
then by `saving_s` (analysis.plan: each finding's own change of time to ready).
"""

from __future__ import annotations

import os
from typing import Any

from starttrace.analysis.findings.common import SEVERITIES
from starttrace.analysis.findings.compile import cold_compile_findings
from starttrace.analysis.findings.cuda import cuda_audit, cuda_findings
from starttrace.analysis.findings.first_request import lazy_first_request_findings
from starttrace.analysis.findings.forkservers import unused_forkserver_findings
from starttrace.analysis.findings.graphs import graph_capture_findings
from starttrace.analysis.findings.inspection import inspection_findings
from starttrace.analysis.findings.kv_profile import kv_profile_findings
from starttrace.analysis.findings.nodes import node_findings
from starttrace.analysis.findings.preload import preload_findings
from starttrace.analysis.findings.stalled import DEFAULT_STALL_S, stalled_findings
from starttrace.analysis.findings.stragglers import straggler_findings
from starttrace.analysis.findings.weights import slow_weights_findings
from starttrace.analysis.model import RunModel
from starttrace.analysis.plan import set_savings

__all__ = ["cuda_audit", "find_all", "preload_advice_rows", "preload_modules", "stall_seconds"]


def stall_seconds(environ: Any = None) -> float:
    """STARTTRACE_STALL_S (seconds, > 0), else the default (60)."""
    raw = (os.environ if environ is None else environ).get("STARTTRACE_STALL_S", "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_STALL_S
    return value if value > 0 else DEFAULT_STALL_S


def find_all(model: RunModel, stall_s: float | None = None) -> list[dict[str, Any]]:
    """Every finding of the model (needs its critical path and CUDA audit), most severe first."""
    found = [
        *stalled_findings(model, stall_seconds() if stall_s is None else stall_s),
        *cuda_findings(model),
        *unused_forkserver_findings(model),
        *preload_findings(model),
        *straggler_findings(model),
        *node_findings(model),
        *cold_compile_findings(model),
        *inspection_findings(model),
        *slow_weights_findings(model),
        *graph_capture_findings(model),
        *kv_profile_findings(model),
        *lazy_first_request_findings(model),
    ]
    set_savings(model, found)  # each finding's own change of time to ready (analysis.plan)
    rank = {sev: i for i, sev in enumerate(SEVERITIES)}
    found.sort(key=lambda f: (rank.get(f["severity"], 9), -(f["saving_s"] or 0), -(f["seconds"] or 0)))
    return found


def preload_advice_rows(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The older per-module `preload_advice` rows (JSON key kept for its users), from the
    `preload` findings: one row per module of each covering list."""
    rows = []
    for f in findings:
        if f["kind"] != "preload":
            continue
        for d in f["modules_detail"]:
            mod = d["module"]
            if f["start_method"] == "forkserver":
                pid = f["forkserver_pid"]
                how = f"add {mod!r} to the forkserver preload of pid {pid} (multiprocessing.set_forkserver_preload)"
            else:
                how = f"start the ranks from a forkserver that preloads {mod!r}"
            rows.append(
                {
                    "module": mod,
                    "ranks": d["ranks"],
                    "saving_per_rank_s": d["seconds_per_rank"],
                    "total_s": round(d["seconds_per_rank"] * d["ranks"], 6),
                    "start_methods": [f["start_method"]],
                    "lanes": f["lanes"],
                    "advice": how,
                }
            )
    rows.sort(key=lambda r: (-r["total_s"], r["module"]))
    return rows


def preload_modules(findings: list[dict[str, Any]]) -> list[str]:
    """Every module of the `preload` findings, in order, once (what `advise --preload-list` prints)."""
    out: list[str] = []
    for f in findings:
        if f["kind"] == "preload":
            out.extend(m for m in f["modules"] if m not in out)
    return out
