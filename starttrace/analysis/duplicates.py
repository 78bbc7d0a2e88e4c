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

import polars as pl

from starttrace.run import Process, Run, decode_attrs

TOLERANCE_NS = 20_000_000  # the two copies wrap one call: they differ by the wrappers' own time


def _ours(process: Process) -> bool:
    res = process.resource or {}
    return "starttrace.run_id" in res or "starttrace.role" in res


def without_vllm_copies(run: Run) -> Run:
    """`run` without vLLM's OTLP copies of journal spans (the same run when it has none); a process
    left with no span is dropped. The copies are an anti-join of the foreign lanes' rows with the
    flagged journal spans (same name, start and end within TOLERANCE_NS)."""
    foreign = [p.instance_id for p in run.processes if not _ours(p)]
    if not foreign:
        return run
    table = run.spans.with_row_index("_row")
    ours = table.filter(~pl.col("lane").is_in(foreign))
    # vLLM's mark names are capitalised ("Load weights"): attributes of those only are decoded
    marks = ours.filter(pl.col("name").str.contains(r"^\p{Lu}")).select("name", "start", "end", "attrs", "attrs_pb")
    flagged_rows = [
        (name, start, end)
        for name, start, end, text, raw in marks.iter_rows()
        if decode_attrs(text, raw).get("starttrace.vllm.otlp") is True
    ]
    if not flagged_rows:
        return run
    flagged = pl.DataFrame(
        flagged_rows, schema={"name": pl.String, "f_start": pl.Int64, "f_end": pl.Int64}, orient="row"
    )
    candidates = table.filter(pl.col("lane").is_in(foreign)).select("_row", "name", "start", "end")
    close = ((pl.col("start") - pl.col("f_start")).abs() <= TOLERANCE_NS) & (
        pl.col("end").is_null() | pl.col("f_end").is_null() | ((pl.col("end") - pl.col("f_end")).abs() <= TOLERANCE_NS)
    )
    copies = candidates.join(flagged, on="name").filter(close).select("_row").unique()
    if not copies.height:
        return run
    spans = table.join(copies, on="_row", how="anti").sort("_row").drop("_row")
    left = set(spans.filter(pl.col("lane").is_in(foreign))["lane"].unique().to_list())
    processes = [p for p in run.processes if _ours(p) or p.instance_id in left]
    return dataclasses.replace(run, processes=processes, spans=spans)
