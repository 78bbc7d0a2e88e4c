"""The vLLM probe's startup phases beyond the loader: the memory profile run, warmup, CUDA-graph
capture per batch size, and the communicators (NCCL / custom all-reduce / P2P check / CPU).

CUDA-graph capture needs a GPU: its spans are written against vLLM 0.32's GPUModelRunner source,
which the first test reads (names and arguments the probe relies on), and exercised here on a
runner class with the same methods, marked with the real (probe-patched) `vllm.tracing.instrument`.
The communicators are exercised for real on CPU: two traced ranks (gloo) run vLLM's own
`init_distributed_environment` + `initialize_model_parallel(2, 1)`, which builds vLLM's
CpuCommunicator for the TP group.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from run_spans import named, spans_of

from starttrace.run import Process, Run, Span
from starttrace.sources.journal_reader import read_run

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")


def _vllm_file(relative: str) -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / relative


def _method(tree: ast.Module, klass: str, name: str) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == klass:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise AssertionError(f"{klass}.{name} not found")


def _instrument_name(function: ast.FunctionDef) -> str | None:
    for decorator in function.decorator_list:
        if isinstance(decorator, ast.Call) and getattr(decorator.func, "id", None) == "instrument":
            for keyword in decorator.keywords:
                if keyword.arg == "span_name" and isinstance(keyword.value, ast.Constant):
                    return str(keyword.value.value)
    return None


def test_the_gpu_runner_source_has_what_the_capture_spans_rely_on() -> None:
    tree = ast.parse(_vllm_file("v1/worker/gpu_model_runner.py").read_text())
    capture = _method(tree, "GPUModelRunner", "capture_model")
    assert _instrument_name(capture) == "Capture model"
    per_size = _method(tree, "GPUModelRunner", "_warmup_and_capture")
    assert [a.arg for a in per_size.args.args[:3]] == ["self", "desc", "cudagraph_runtime_mode"]
    assert _method(tree, "GPUModelRunner", "profile_run")
    # the per-size loop calls it once per BatchDescriptor
    loop = _method(tree, "GPUModelRunner", "_capture_cudagraphs")
    assert "self._warmup_and_capture(" in ast.unparse(loop)
    descriptor = ast.parse(_vllm_file("forward_context.py").read_text())
    fields = set()
    for node in ast.walk(descriptor):
        if isinstance(node, ast.ClassDef) and node.name == "BatchDescriptor":
            fields = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert {"num_tokens", "uniform"} <= fields
    cpu = ast.parse(_vllm_file("v1/worker/cpu_model_runner.py").read_text())
    assert _instrument_name(_method(cpu, "CPUModelRunner", "warming_up_model")) == "Warmup (CPU)"


RUNNER = r"""
import enum, json, time
from typing import NamedTuple
from vllm.tracing import instrument  # the probe replaced it when vllm.tracing was imported
from starttrace.tracer.probes import vllm as probe


class BatchDescriptor(NamedTuple):
    num_tokens: int
    uniform: bool = False


class CUDAGraphMode(enum.Enum):
    PIECEWISE = 1
    FULL = 2


class Runner:  # GPUModelRunner's methods the probe wraps, same names and arguments
    def profile_run(self):
        time.sleep(0.002)

    @instrument(span_name="Warmup (CPU)")
    def warming_up_model(self):
        self.profile_run()

    def _warmup_and_capture(self, desc, cudagraph_runtime_mode, profile_seq_lens=None, allow_microbatching=False,
                            num_warmups=None, profiler=None):
        time.sleep(0.002)

    @instrument(span_name="Capture model")
    def capture_model(self):
        for size in (8, 4, 2, 1):
            self._warmup_and_capture(BatchDescriptor(size, True), cudagraph_runtime_mode=CUDAGraphMode.FULL)
        return 123456


probe._patch_model_runner(Runner())  # what the probe does once init_device built the runner
runner = Runner()
runner.profile_run()
runner.warming_up_model()
print(json.dumps({"result": runner.capture_model()}))
"""


def _traced(tmp_path: Path, clean_env, args: list[str], timeout: int = 300) -> tuple[dict, Run]:
    journal_root = tmp_path / "runs"
    env = clean_env(STARTTRACE="1", STARTTRACE_DIR=str(journal_root), VLLM_LOGGING_LEVEL="WARNING")
    done = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = [p for p in journal_root.iterdir() if p.is_dir()]
    return json.loads(done.stdout.strip().splitlines()[-1]), read_run(run_dir)


def _named(run: Run, process: Process, name: str) -> list[Span]:
    return sorted(named(run, process, name), key=lambda s: s.start_ns)


def test_profile_run_warmup_and_capture_per_batch_size(tmp_path: Path, clean_env) -> None:
    out, run = _traced(tmp_path, clean_env, ["-c", RUNNER])
    assert out["result"] == 123456
    (process,) = run.processes
    # profile_run: the memory profile on its own, a warmup inside vLLM's "Warmup (CPU)"
    profile, in_warmup = _named(run, process, "vllm.kv_cache.profile_run")
    assert profile.attrs["starttrace.phase"] == "kv_cache"
    assert in_warmup.attrs["starttrace.phase"] == "warmup"
    assert in_warmup.attrs["vllm.profile_run.purpose"] == "warmup"
    (warmup,) = _named(run, process, "Warmup (CPU)")
    assert warmup.attrs["starttrace.phase"] == "warmup" and in_warmup.parent_id == warmup.span_id
    assert warmup.attrs["starttrace.vllm.replaces"] == "vllm.warmup"  # the table row it stands for
    # capture: vLLM's "Capture model" with the bytes it returned, one child per batch size
    (capture,) = _named(run, process, "Capture model")
    assert capture.attrs["starttrace.phase"] == "cuda_graphs"
    assert capture.attrs["starttrace.cuda_graphs.memory_bytes"] == 123456
    assert capture.attrs["starttrace.cuda_graphs.count"] == 4
    assert capture.attrs["starttrace.vllm.replaces"] == "vllm.cuda_graphs.capture"
    sizes = _named(run, process, "cuda_graphs.capture")
    assert [s.attrs["starttrace.cuda_graphs.batch_size"] for s in sizes] == [8, 4, 2, 1]
    for span in sizes:
        assert span.parent_id == capture.span_id
        assert span.attrs["starttrace.phase"] == "cuda_graphs"
        assert span.attrs["starttrace.cuda_graphs.mode"] == "FULL"
        assert span.attrs["starttrace.cuda_graphs.uniform_decode"] is True
        assert "starttrace.cuda_graphs.memory_bytes" not in span.attrs  # no CUDA here: not measured
    # our own rows for what vLLM marks record nothing
    assert not _named(run, process, "vllm.cuda_graphs.capture") and not _named(run, process, "vllm.warmup")


RANKS = r"""
import json, multiprocessing as mp, socket, sys


def rank_main(rank, port):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    with set_current_vllm_config(VllmConfig()):
        ps.init_distributed_environment(world_size=2, rank=rank, local_rank=rank, backend="gloo",
                                        distributed_init_method=f"tcp://127.0.0.1:{port}")
        ps.initialize_model_parallel(2, 1)
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()


if __name__ == "__main__":
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, port)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    print(json.dumps({"codes": [p.exitcode for p in procs]}))
"""


def test_communicators_on_two_cpu_ranks(tmp_path: Path, clean_env) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    out, run = _traced(tmp_path, clean_env, [str(script)], 400)
    assert out["codes"] == [0, 0]
    ranks = [p for p in run.processes if named(run, p, "vllm.init_distributed_environment")]
    assert len(ranks) == 2
    for process in ranks:
        groups = {s.attrs.get("vllm.dist.group") for s in _named(run, process, "vllm.dist.group.init")}
        assert {"world", "tp"} <= groups, groups
        communicators = _named(run, process, "vllm.dist.device_communicator.init")
        assert communicators, [s.name for s in spans_of(run, process) if not s.name.startswith("import")]
        for span in communicators:
            assert span.attrs["starttrace.phase"] == "dist_init"
            assert span.attrs["starttrace.dist.group_size"] == 2
            assert span.attrs["code.function"].endswith("CpuCommunicator.__init__")
        assert (
            "vllm.distributed.device_communicators.cpu_communicator.CpuCommunicator.__init__"
            in process.resource["starttrace.probes"]
        )


AOT = r"""
import json, os, sys, types
import torch
from vllm.config import VllmConfig
from vllm.compilation import decorators

folder = sys.argv[1]
config = VllmConfig()


def forward(x):
    return x


model = types.SimpleNamespace(vllm_config=config, _is_encoder=False, _compile_tag="", forward=forward,
                              compilation_config=config.compilation_config)
results = {}
# a cold start: no artifact yet
results["cold"] = decorators._try_load_aot_compiled_fn(model, os.path.join(folder, "missing", "model"))
# a broken artifact: vLLM compiles again
broken = os.path.join(folder, "broken")
os.makedirs(broken)
with open(os.path.join(broken, "model"), "wb") as f:
    f.write(b"not a compiled function")
results["broken"] = decorators._try_load_aot_compiled_fn(model, os.path.join(broken, "model"))


# a warm start: torch's loader stubbed to what it returns (a loaded function), the rest is vLLM's
class Loaded:
    _artifacts = types.SimpleNamespace(compiled_fn=types.SimpleNamespace(finalize_loading=lambda cfg: None))

    def source_info(self):
        return types.SimpleNamespace(inlined_sources=[])

    def disable_guard_check(self):
        pass


torch.compiler.load_compiled_function = lambda f, f_globals=None: Loaded()
good = os.path.join(folder, "good")
os.makedirs(good)
with open(os.path.join(good, "model"), "wb") as f:
    f.write(b"artifact")
results["warm"] = decorators._try_load_aot_compiled_fn(model, os.path.join(good, "model"))
print(json.dumps({k: v is not None for k, v in results.items()}))
"""


def test_vllm_aot_load_is_a_compile_graph_hit(tmp_path: Path, clean_env) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    out, run = _traced(tmp_path, clean_env, ["-c", AOT, str(folder)])
    (process,) = run.processes
    assert out == {"cold": False, "broken": False, "warm": True}
    (hit,) = _named(run, process, "compile.graph")
    assert hit.attrs["starttrace.compile.cache"] == "hit"
    assert hit.attrs["starttrace.compile.cache_dir"] == str(folder / "good")
    assert hit.attrs["starttrace.phase"] == "compile" and hit.error is None
    (failed,) = _named(run, process, "compile.aot_load")
    assert failed.attrs["starttrace.compile.cache"] == "miss"
    assert failed.attrs["starttrace.compile.cache_dir"] == str(folder / "broken")
    assert failed.error
    # nothing for the cold start's missing artifact
    missing = str(folder / "missing")
    assert not [s for s in spans_of(run, process) if s.attrs.get("starttrace.compile.cache_dir") == missing]


PLAN = r"""
import json, os, sys
os.environ["VLLM_CACHE_ROOT"] = sys.argv[1]
from vllm.v1.worker import startup_plan

path = startup_plan._plan_path("abc")
os.makedirs(os.path.dirname(path))
with open(path, "w") as f:
    json.dump({"schema": startup_plan.PLAN_SCHEMA_VERSION, "fingerprint": "abc", "kv_cache_memory_bytes": 1,
               "free_memory_baseline": 1}, f)
found = startup_plan._load_plan("abc")
print(json.dumps({"hit": found is not None, "miss": startup_plan._load_plan("other")}))
"""


def test_vllm_startup_plan_lookup_is_a_hit_or_a_miss(tmp_path: Path, clean_env) -> None:
    out, run = _traced(tmp_path, clean_env, ["-c", PLAN, str(tmp_path / "cache")])
    assert out == {"hit": True, "miss": None}
    (process,) = run.processes
    hit, miss = _named(run, process, "vllm.startup_plan.load")
    assert hit.attrs["vllm.startup_plan"] == "hit" and miss.attrs["vllm.startup_plan"] == "miss"
    assert hit.attrs["starttrace.phase"] == "kv_cache"
