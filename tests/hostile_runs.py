"""Runs of hostile spans for the tests of issue 38 (service and browser tests alike)."""

from __future__ import annotations

import math

from synth_runs import SProcess, SRun, SSpan

T0 = 1_796_269_000_000_000_000  # 2026-12-03
S = 10**9


def nonfinite_run(run_id: str = "nan") -> SRun:
    res = {"service.name": "svc", "service.instance.id": f"i-{run_id}", "process.pid": 42, "starttrace.run_id": run_id}
    weights = {
        "starttrace.phase": "weights",
        "starttrace.weights.file": "model.safetensors",
        "starttrace.weights.file_bytes": 10**9,
        "starttrace.weights.page_cache_fraction": math.nan,
    }
    graph = {"starttrace.phase": "compile", "starttrace.compile.graphs": math.inf, "starttrace.compile.cache": "miss"}
    spans = [
        SSpan("%016x" % 1, None, "process", T0, T0 + 10 * S),
        SSpan("%016x" % 2, "%016x" % 1, "weights.load", T0 + 1000, T0 + 4 * S, weights),
        SSpan("%016x" % 3, "%016x" % 1, "compile.graph", T0 + 4 * S, T0 + 9 * S, graph),
        SSpan("%016x" % 4, "%016x" % 1, "odd", T0 + 9 * S, T0 + 9 * S + 5, {"neg": -math.inf, "list": [1.5, math.nan]}),
    ]
    return SRun(run_id, "ab" * 16, [SProcess(res, spans)])


def reused_ids_run(run_id: str = "reuse") -> SRun:
    """An API server and two workers whose exporters reuse one set of span ids: the API server's
    `ready` (id 3) is, in each worker, a span still in progress at the same id."""
    processes = []
    for k, role in enumerate(("api_server", "worker", "worker")):
        res = {
            "service.name": "svc",
            "service.instance.id": f"{run_id}-{k}",
            "process.pid": 100 + k,
            "starttrace.run_id": run_id,
            "starttrace.role": role,
        }
        if role == "worker":
            res["starttrace.rank"] = k - 1
        t = T0 + k * S // 10
        spans = [
            SSpan("%016x" % 1, None, "process", t, t + 5 * S, {"starttrace.phase": "process"}),
            SSpan("%016x" % 2, "%016x" % 1, "import torch", t + 1000, t + 2 * S, {"starttrace.phase": "import"}),
        ]
        if role == "api_server":
            spans.append(SSpan("%016x" % 3, "%016x" % 1, "ready", t + 4 * S, t + 4 * S, {"starttrace.phase": "ready"}))
        else:
            spans.append(
                SSpan("%016x" % 3, "%016x" % 1, "model.load", t + 2 * S, t + 2 * S, {"starttrace.in_progress": True})
            )
        processes.append(SProcess(res, spans))
    return SRun(run_id, "cd" * 16, processes)


def deep_run(run_id: str, depth: int) -> SRun:
    """A `process` span and `depth` imports each inside the one before (1 µs apart)."""
    res = {"service.name": "deep", "service.instance.id": f"i-{run_id}", "process.pid": 7, "starttrace.run_id": run_id}
    end = T0 + 2 * depth * 1000 + 10**6
    spans = [SSpan("%016x" % 1, None, "process", T0, end, {"starttrace.phase": "process"})]
    for i in range(depth):
        spans.append(
            SSpan(
                "%016x" % (i + 2),
                "%016x" % (i + 1),
                f"import m{i}",
                T0 + (i + 1) * 1000,
                end - (i + 1) * 1000,
                {"starttrace.phase": "import", "starttrace.import.module": f"m{i}"},
            )
        )
    return SRun(run_id, "%032x" % depth, [SProcess(res, spans)])
