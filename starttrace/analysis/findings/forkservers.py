"""`unused_forkserver` findings: a forkserver that preloaded but forked nothing during startup.

Its cost is its preload (seconds of imports, on cores the rest of the startup needed). Whether
its preload overlapped the critical path: the time its `forkserver.preload` ran while a step of
the critical path (in another process) ran.
"""

from __future__ import annotations

from typing import Any

from starttrace.analysis.findings.common import (
    cutoff_ns,
    finding,
    is_forkserver,
    launcher_lane,
    module_list,
    overlap_ns,
    preload_list,
    preload_span,
    s,
)
from starttrace.analysis.model import Lane, RunModel

MIN_PRELOAD_S = 0.05


def unused_forkserver_findings(model: RunModel) -> list[dict[str, Any]]:
    out = []
    for lane in model.lanes:
        if not is_forkserver(model, lane):
            continue
        until = cutoff_ns(model, lane)
        forks = [n for n in model.select(("fork",), ("process.fork",), lane=lane) if n.start < until]
        children = [ln for ln in model.lanes if ln.start_method == "forkserver" and ln.ppid == lane.pid]
        pre = preload_span(model, lane)
        if forks or children or pre is None or pre.duration / 1e9 < MIN_PRELOAD_S:
            continue
        out.append(_finding(model, lane, pre.start, pre.eff_end))
    return out


def _finding(model: RunModel, lane: Lane, start: int, end: int) -> dict[str, Any]:
    seconds = (end - start) / 1e9
    path = [(st.start, st.end) for st in model.critical_path if st.lane != lane.index]
    during = overlap_ns((start, end), path) / 1e9
    starter = launcher_lane(model, lane)
    by = f" (started by {starter.label})" if starter is not None else ""
    preload = preload_list(model, lane)
    text = f"{lane.label}{by} preloaded {module_list(preload)} for {s(seconds)} and forked nothing during startup"
    if during > 0:
        text += f"; its preload ran during {s(during)} of the critical path, competing for CPU with it"
    else:
        text += "; its preload did not overlap the critical path"
    spawned = sorted({ln.start_method for ln in model.lanes if ln.start_method in ("spawn", "fork")})
    vllm = starter is not None and starter.role == "api_server"
    if vllm:
        action = (
            "vLLM started this forkserver for VLLM_WORKER_MULTIPROC_METHOD=forkserver, then started the "
            f"EngineCore and the workers with {'/'.join(spawned) or 'another method'} (its CPU platform forces "
            "spawn): unset VLLM_WORKER_MULTIPROC_METHOD (or use spawn) to save the preload"
        )
    else:
        action = (
            "do not start this forkserver, or start the processes from it (multiprocessing.get_context('forkserver'))"
        )
    return finding(
        "unused_forkserver",
        "warning" if during >= 0.5 or seconds >= 1.0 else "info",
        [lane] + ([starter] if starter is not None else []),
        seconds,
        text,
        action,
        forkserver_pid=lane.pid,
        preload=preload,
        preload_s=round(seconds, 6),
        critical_path_overlap_s=round(during, 6),
        started_by_pid=starter.pid if starter is not None else None,
    )
