"""A vLLM mark reaches a run twice when vLLM's own OTLP export is on too: the journal's span (in
its process's lane, flagged `starttrace.vllm.otlp`) and vLLM's copy under vLLM's own resource.
The phase counts once: the copy is dropped, the journal span kept; other spans of vLLM's resource
stay."""

from __future__ import annotations

import polars as pl
from finding_runs import MS, T0, Builder

from starttrace.analysis.duplicates import without_vllm_copies
from starttrace.analysis.lanes import build_model
from starttrace.run import Process, Span, spans_table


def _run(flagged: bool) -> Builder:
    b = Builder(["/venv/bin/vllm", "serve", "m"])
    api = b.proc(100, 1, "api_server", "root", None, 0, 5_000)
    w = b.proc(110, 100, "worker", "spawn", None, 10, 5_000, rank=0, world_size=1)
    b.span(w, "Load weights", 1_000, 3_000, phase="model_load", source="vllm")
    if flagged:
        w.spans[-1].attrs["starttrace.vllm.otlp"] = True  # the builder's own span list (before `build`)
    b.span(api, "uvicorn.startup", 4_000, 4_100, phase="server_startup")
    return b


def _with_vllm_exporter(b: Builder) -> list[str]:
    run = b.build(ready_at=4_200)
    copies = [
        Span("c1", None, "Load weights", T0 + 1_000 * MS + 300_000, T0 + 3_000 * MS - 200_000),
        Span("c2", None, "Overall Loading", T0 + 900 * MS, T0 + 3_100 * MS),  # not in the journal: kept
    ]
    run.processes.append(Process("vllm-otel", 0, 0, None, {"service.name": "vllm"}, ""))
    run.spans = pl.concat([run.spans, spans_table(("vllm-otel", s) for s in copies)])
    model = build_model(run)
    return model.spans["name"].to_list()


def test_vllm_copy_of_a_flagged_mark_is_dropped() -> None:
    names = _with_vllm_exporter(_run(flagged=True))
    assert names.count("Load weights") == 1
    assert "Overall Loading" in names


def test_without_the_flag_nothing_is_dropped() -> None:
    names = _with_vllm_exporter(_run(flagged=False))
    assert names.count("Load weights") == 2


def test_the_copy_is_dropped_from_the_run_itself() -> None:
    """The source-level pass (no model): the copy's row goes, the foreign lane with a span left
    stays; a foreign lane left with none is dropped."""
    run = _run(flagged=True).build(ready_at=4_200)
    copies = [Span("c1", None, "Load weights", T0 + 1_000 * MS + 300_000, T0 + 3_000 * MS - 200_000)]
    run.processes.append(Process("vllm-otel", 0, 0, None, {"service.name": "vllm"}, ""))
    run.spans = pl.concat([run.spans, spans_table(("vllm-otel", s) for s in copies)])
    clean = without_vllm_copies(run)
    assert clean.spans.height == run.spans.height - 1
    assert "c1" not in clean.spans["span_id"].to_list()
    assert [p.instance_id for p in clean.processes] == [p.instance_id for p in run.processes[:-1]]
    unflagged = _run(flagged=False).build(ready_at=4_200)
    unflagged.processes.append(Process("vllm-otel", 0, 0, None, {"service.name": "vllm"}, ""))
    unflagged.spans = pl.concat([unflagged.spans, spans_table(("vllm-otel", s) for s in copies)])
    assert without_vllm_copies(unflagged) is unflagged
