"""vLLM's own OTLP copy of a phase the journal already holds.

vLLM marks its phases with `vllm.tracing.instrument`; the vLLM probe records each mark in the
journal, in the process's own lane (`starttrace.source` = `vllm`). When vLLM's own OTLP export is on
as well (`--otlp-traces-endpoint`), vLLM sends its copy of the same span under its own OpenTelemetry
resource (no starttrace identity, often no pid), and the journal span says so
(`starttrace.vllm.otlp` = true). Where both streams reach one run (the service fed by vLLM's
exporter or by a Collector that gets both), the phase would count twice: the copy is dropped here,
the journal span (in the right lane, with rank and role) kept. A copy is a span of a process with no
starttrace identity whose name is a flagged journal span's and whose start and end are within
TOLERANCE_NS of it.
"""

from __future__ import annotations

import dataclasses

from starttrace.run import Process, Run

TOLERANCE_NS = 20_000_000  # the two copies wrap one call: they differ by the wrappers' own time


def _ours(process: Process) -> bool:
    res = process.resource or {}
    return "starttrace.run_id" in res or "starttrace.role" in res


def without_vllm_copies(run: Run) -> Run:
    """`run` without vLLM's OTLP copies of journal spans (the same run when it has none); a process
    left with no span is dropped."""
    foreign = [p for p in run.processes if not _ours(p)]
    if not foreign:
        return run
    flagged: dict[str, list[tuple[int, int | None]]] = {}
    for p in run.processes:
        if not _ours(p):
            continue
        for s in p.spans:
            name = s.name
            # vLLM's mark names are capitalised ("Load weights"); read attributes of those only
            if name[:1].isupper() and s.attrs is not None and s.attrs.get("starttrace.vllm.otlp") is True:
                flagged.setdefault(name, []).append((s.start_ns, s.end_ns))
    if not flagged:
        return run
    processes = []
    changed = False
    for p in run.processes:
        if _ours(p):
            processes.append(p)
            continue
        kept = [s for s in p.spans if not _is_copy(s.name, s.start_ns, s.end_ns, flagged)]
        if len(kept) != len(p.spans):
            changed = True
        if kept:
            processes.append(p if len(kept) == len(p.spans) else dataclasses.replace(p, spans=kept))
    return dataclasses.replace(run, processes=processes) if changed else run


def _is_copy(name: str, start: int, end: int | None, flagged: dict[str, list[tuple[int, int | None]]]) -> bool:
    for a, b in flagged.get(name, ()):
        if abs(start - a) <= TOLERANCE_NS and (end is None or b is None or abs(end - b) <= TOLERANCE_NS):
            return True
    return False
