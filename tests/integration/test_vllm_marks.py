"""vLLM's own instrumentation points (`vllm.tracing.instrument`) become journal spans, each once.

A traced process imports real vLLM 0.32 modules (no server): the default model loader, whose
`DefaultModelLoader.load_weights` vLLM marks "Load weights", and the executor modules, whose
`Executor.__init__` / `WorkerProc.__init__` vLLM marks and our own table wraps too. Checked: the
span is in the journal once, named as vLLM names it, with the mapped phase; our table rows for
marked functions record no span of their own (their identity callbacks still run); with vLLM's own
OpenTelemetry export on, vLLM's copy goes out once and the journal span says so.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from run_spans import named, spans_of

from starttrace.sources.journal_reader import Process, Run, read_run
from starttrace.tracer.probes.vllm import MANUAL_POINTS, VLLM_MARK_PHASES, mark_phase

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")

REPO = Path(__file__).resolve().parents[2]

PROGRAM = r"""
import json, sys
WITH_OTEL = sys.argv[1] == "otel"
exported = None
if WITH_OTEL:  # what vLLM's init_tracer does with --otlp-traces-endpoint, with an in-memory exporter
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    trace.set_tracer_provider(provider)

from vllm.model_executor.model_loader import default_loader
from vllm.v1.executor import abstract, multiproc_executor


class Config:
    quantization = None


class Loader:  # what DefaultModelLoader.load_weights uses of its self
    enable_weights_track = False
    counter_before_loading_weights = 0.0

    def _init_ep_weight_filter(self, model_config):
        pass

    def _init_mm_encoder_only_weight_filter(self, model, model_config):
        pass

    def get_all_weights(self, model_config, model):
        return iter(())


class Model:
    def load_weights(self, weights):
        return set(weights)


default_loader.DefaultModelLoader.load_weights(Loader(), Model(), Config())
print(json.dumps({
    "marks": {
        "load_weights": getattr(default_loader.DefaultModelLoader.load_weights, "__starttrace_vllm_mark__", None),
        "executor_init": getattr(abstract.Executor.__init__, "__starttrace_vllm_mark__", None),
        "worker_proc_init": getattr(multiproc_executor.WorkerProc.__init__, "__starttrace_vllm_mark__", None),
    },
    "hooks_on_worker_proc_init": getattr(multiproc_executor.WorkerProc.__init__, "__starttrace_hooks__", False),
    "otel": None if exported is None else [s.name for s in exported.get_finished_spans()],
}))
"""


def _traced(tmp_path: Path, clean_env, mode: str) -> tuple[dict, Run, Process]:
    journal_root = tmp_path / "runs"
    env = clean_env(STARTTRACE="1", STARTTRACE_DIR=str(journal_root), VLLM_LOGGING_LEVEL="WARNING")
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = [p for p in journal_root.iterdir() if p.is_dir()]
    run = read_run(run_dir)
    (process,) = run.processes
    return json.loads(done.stdout.strip().splitlines()[-1]), run, process


def test_a_vllm_mark_is_one_journal_span_with_its_phase(tmp_path: Path, clean_env) -> None:
    out, run, process = _traced(tmp_path, clean_env, "plain")
    assert out["marks"] == {
        "load_weights": "Load weights",
        "executor_init": "Executor init",
        "worker_proc_init": "Worker init",
    }
    (span,) = named(run, process, "Load weights")
    assert span.attrs["starttrace.phase"] == "model_load"
    assert span.attrs["starttrace.source"] == "vllm"
    assert span.attrs["code.function"].endswith("default_loader.DefaultModelLoader.load_weights")
    assert span.error is None and span.end_ns is not None and span.end_ns >= span.start_ns
    assert "starttrace.vllm.otlp" not in span.attrs  # vLLM's OTel export is off
    # the probe list names the marked functions; our table's own span rows for them are gone
    probes = process.resource["starttrace.probes"]
    assert "vllm.tracing.instrument" in probes
    assert "vllm.model_executor.model_loader.default_loader.DefaultModelLoader.load_weights" in probes
    # WorkerProc.__init__: vLLM's mark is the span, our row keeps only its identity callback
    assert out["hooks_on_worker_proc_init"] is True
    assert not [s for s in spans_of(run, process) if s.name in ("vllm.executor.init", "vllm.worker.init")]


def test_with_vllms_own_otel_export_the_span_is_once_in_each(tmp_path: Path, clean_env) -> None:
    out, run, process = _traced(tmp_path, clean_env, "otel")
    assert out["otel"] == ["Load weights"]  # vLLM's own copy, exported once
    (span,) = named(run, process, "Load weights")
    assert span.attrs["starttrace.vllm.otlp"] is True
    assert span.attrs["starttrace.phase"] == "model_load"


def test_every_instrument_point_of_the_installed_vllm_has_a_mapped_phase() -> None:
    """Each `instrument(span_name=...)` / `instrument_manual(...)` startup point in the installed
    vLLM is in the table (a later vLLM adding one makes this fail: map it)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent
    names: set[str] = set()
    pattern = re.compile(r'@instrument\(span_name="([^"]+)"\)|instrument_manual\(\s*"([^"]+)"')
    for path in root.rglob("*.py"):
        text = path.read_text(errors="replace")
        if "instrument" not in text:
            continue
        for match in pattern.finditer(text):
            names.add(match.group(1) or match.group(2))
    assert len(names) >= 20, names
    assert names - set(VLLM_MARK_PHASES) == set()
    assert set(MANUAL_POINTS) <= names
    assert {mark_phase(n) for n in names} <= {
        "api_server",
        "engine_init",
        "executor_init",
        "worker_init",
        "device_init",
        "model_load",
        "kv_cache",
        "warmup",
        "cuda_graphs",
        "compile",
    }


@pytest.mark.parametrize(
    ("name", "phase"),
    [
        ("Load weights", "model_load"),
        ("Capture model", "cuda_graphs"),
        ("Allocate KV cache", "kv_cache"),
        ("Warmup (CPU)", "warmup"),
        ("Inductor compilation", "compile"),
        ("Some future KV cache step", "kv_cache"),
        ("NCCL warmup", "warmup"),
        ("Something else", "vllm"),
    ],
)
def test_mark_phase(name: str, phase: str) -> None:
    assert mark_phase(name) == phase
