"""The compile probe on a real torch.compile: a small module compiled cold, then warm, on one fresh
TORCHINDUCTOR_CACHE_DIR (two traced runs of the same program).

Checked: one `compile.graph` span per compile id with the cache verdict (cold: `miss`; warm: `hit`
and nothing else), the cache directory, the frame and graph count; the steps of the compile as
child spans (`compile.bytecode_tracing`, `compile.backend_compile`, `compile.inductor_compile`
on the cold run) nested under it; torch is imported by the program only.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from run_spans import named, spans_of

from starttrace.run import Process, Run, Span
from starttrace.sources.journal_reader import read_run

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")

PROGRAM = r"""
import json, sys
probe_before_torch = "starttrace.tracer.probes.compile" in sys.modules
import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 128)
        self.b = torch.nn.Linear(128, 64)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) + x


model = torch.compile(Block())
with torch.no_grad():
    out = model(torch.randn(8, 64))
print(json.dumps({"probe_before_torch": probe_before_torch, "shape": list(out.shape)}))
"""


def _traced_run(tmp_path: Path, clean_env, cache_dir: Path, name: str) -> tuple[dict, Run]:
    journal_root = tmp_path / f"runs-{name}"
    env = clean_env(
        STARTTRACE="1",
        STARTTRACE_DIR=str(journal_root),
        TORCHINDUCTOR_CACHE_DIR=str(cache_dir),
        TORCHINDUCTOR_COMPILE_THREADS="1",
    )
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = [p for p in journal_root.iterdir() if p.is_dir()]
    run = read_run(run_dir)
    _root(run)
    return json.loads(done.stdout.strip().splitlines()[-1]), run


def _root(run: Run) -> Process:
    roots = [p for p in run.processes if p.record.get("method") == "root"]
    assert len(roots) == 1, [(p.pid, p.role) for p in run.processes]
    return roots[0]


@pytest.fixture(scope="module")
def cold_and_warm(tmp_path_factory: pytest.TempPathFactory, clean_env: Any) -> tuple[Path, Run, Run, dict]:
    # the session fixture, not `import conftest`: several conftest.py exist under tests/
    base = tmp_path_factory.mktemp("compile")
    cache_dir = base / "inductor-cache"
    cold_out, cold = _traced_run(base, clean_env, cache_dir, "cold")
    warm_out, warm = _traced_run(base, clean_env, cache_dir, "warm")
    assert cold_out["shape"] == warm_out["shape"] == [8, 64]
    assert not cold_out["probe_before_torch"] and not warm_out["probe_before_torch"]
    return cache_dir, cold, warm, cold_out


def _graphs(run: Run) -> list[Span]:
    """The root process's `compile.graph` spans."""
    return named(run, _root(run), "compile.graph")


def _descendants(run: Run, root: Span) -> list[Span]:
    """The spans under `root` in the root process."""
    children: dict[str, list[Span]] = {}
    for span in spans_of(run, _root(run)):
        if span.parent_id:
            children.setdefault(span.parent_id, []).append(span)
    found: list[Span] = []
    todo = [root.span_id]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.span_id)
    return found


def test_cold_run_compile_spans_say_miss(cold_and_warm) -> None:
    cache_dir, cold, _warm, _out = cold_and_warm
    graphs = _graphs(cold)
    assert graphs, [s.name for s in spans_of(cold, _root(cold)) if s.name.startswith("compile")]
    assert {g.attrs["starttrace.compile.cache"] for g in graphs} == {"miss"}
    (graph,) = [g for g in graphs if g.attrs["starttrace.compile.id"] == "0/0"]
    assert graph.attrs["starttrace.phase"] == "compile"
    assert graph.attrs["starttrace.compile.cache_dir"] == str(cache_dir)
    assert graph.attrs["starttrace.compile.graphs"] == 1
    assert graph.attrs["starttrace.compile.fxgraph_cache_miss"] == 1
    assert graph.attrs["starttrace.compile.frame"].startswith("forward (")
    assert graph.end_ns is not None and graph.end_ns > graph.start_ns
    steps = [s for s in _descendants(cold, graph) if s.name.startswith("compile.")]  # imports nest too
    names = {s.name for s in steps}
    assert {"compile.bytecode_tracing", "compile.backend_compile", "compile.inductor_compile"} <= names, names
    for step in steps:
        assert step.attrs["starttrace.phase"] == "compile"
        assert step.end_ns is not None and graph.start_ns <= step.start_ns <= step.end_ns <= graph.end_ns
    # nested as torch nests them: inductor_compile inside backend_compile
    by_id = {s.span_id: s for s in steps}
    (inductor,) = [s for s in steps if s.name == "compile.inductor_compile"]
    chain = []
    parent = by_id.get(inductor.parent_id or "")
    while parent is not None:
        chain.append(parent.name)
        parent = by_id.get(parent.parent_id or "")
    assert "compile.backend_compile" in chain
    assert "torch._dynamo.utils.ChromiumEventLogger.log_event_start" in _root(cold).resource["starttrace.probes"]


def test_warm_run_compile_spans_say_hit_and_nothing_else(cold_and_warm) -> None:
    cache_dir, cold, warm, _out = cold_and_warm
    graphs = _graphs(warm)
    assert len(graphs) == len(_graphs(cold))
    assert {g.attrs["starttrace.compile.cache"] for g in graphs} == {"hit"}
    for graph in graphs:
        assert graph.attrs["starttrace.compile.cache_dir"] == str(cache_dir)
        assert "starttrace.compile.fxgraph_cache_miss" not in graph.attrs
    # the warm compile is shorter: no Inductor codegen
    cold_s = sum((g.end_ns or 0) - g.start_ns for g in _graphs(cold))
    warm_s = sum((g.end_ns or 0) - g.start_ns for g in graphs)
    assert warm_s < cold_s


AOT_PROGRAM = r"""
import os, sys
import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 64)

    def forward(self, x):
        return torch.relu(self.a(x))


model = Block()
x = torch.randn(8, 64)
path = sys.argv[1]
with torch.no_grad():
    if os.path.exists(path):  # warm: what vLLM does with its AOT artifact
        with open(path, "rb") as f:
            fn = torch.compiler.load_compiled_function(f)
        fn(model, x)
    else:  # cold: vLLM's AOT compile (torch.compile(..., fullgraph=True).aot_compile, then save)
        with torch._dynamo.config.patch(enable_aot_compile=True):
            compiled = torch.compile(Block.forward, fullgraph=True, dynamic=False, backend="inductor")
        aot = compiled.aot_compile(((model, x), {}))
        aot.save_compiled_function(path)
        aot(model, x)
print("{}")
"""


def test_aot_compile_cold_miss_then_aot_load_hit(tmp_path: Path, clean_env) -> None:
    """torch's AOT compile (vLLM's default on torch >= 2.10): the Inductor compile runs outside a
    compile id and skips the FX graph cache, and a warm start loads the artifact without Dynamo.
    The graph is still one compile.graph: `miss` cold (Inductor generated code), `hit` warm."""
    if not hasattr(getattr(__import__("torch")._dynamo, "config", None), "enable_aot_compile"):
        pytest.skip("this torch has no AOT compile")
    artifact = tmp_path / "model.aot"
    graphs = {}
    for name in ("cold", "warm"):
        journal_root = tmp_path / f"runs-{name}"
        env = clean_env(STARTTRACE="1", STARTTRACE_DIR=str(journal_root), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "c"))
        done = subprocess.run(
            [sys.executable, "-c", AOT_PROGRAM, str(artifact)], env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
        (run_dir,) = [p for p in journal_root.iterdir() if p.is_dir()]
        run = read_run(run_dir)
        (root,) = [p for p in run.processes if p.record.get("method") == "root"]
        graphs[name] = named(run, root, "compile.graph")
    (cold,) = graphs["cold"]
    assert cold.attrs["starttrace.compile.cache"] == "miss"
    assert cold.attrs["starttrace.compile.id"] == "0/0"
    assert cold.attrs["starttrace.compile.codegen"] >= 1
    assert cold.attrs["starttrace.compile.graphs"] >= 1
    assert {g.attrs["starttrace.compile.cache"] for g in graphs["warm"]} == {"hit"}
    assert all(g.attrs.get("starttrace.compile.cache_loads", 0) >= 1 for g in graphs["warm"])


@pytest.mark.parametrize(
    ("delta", "expected"),
    [
        ({"fxgraph_cache_miss": 1, "aotautograd_cache_miss": 1}, "miss"),
        ({"fxgraph_cache_hit": 1, "aotautograd_cache_miss": 1}, "hit"),  # vLLM #20451: AOT miss on a warm start
        ({"aotautograd_cache_hit": 1}, "hit"),
        ({"vllm_artifacts_loaded": 3}, "hit"),
        ({"vllm_artifacts_saved": 3, "fxgraph_cache_hit": 2}, "miss"),
        ({"fxgraph_cache_bypass": 1}, "none"),
        ({}, "none"),
    ],
)
def test_verdict(delta: dict[str, int], expected: str) -> None:
    from starttrace.tracer.probes.compile import verdict

    assert verdict(delta) == expected


def test_verdict_from_events() -> None:
    from starttrace.tracer.probes.compile import verdict

    assert verdict({}, codegen=1) == "miss"  # AOT compile: Inductor generated code, no FX cache asked
    assert verdict({"fxgraph_cache_bypass": 1}, codegen=1) == "miss"
    assert verdict({}, loaded=1) == "hit"  # a warm AOT load
    assert verdict({"vllm_artifacts_loaded": 1}, codegen=1) == "miss"
